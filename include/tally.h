/*
 * tally.h: transactions on a Tally FUSE mount (`tally mount`) from C and any language that can
 * call ioctl(2). The Rust crate `tally-client` defines the same numbers; its tests compile this
 * header and compare. Semantics in docs/TRANSACTIONS.md.
 *
 * A transaction is begun with an ioctl on any open file or directory of the mount and is owned
 * by that open file: commit, commit-durable and abort go through it (or a dup/inherited copy);
 * closing its last copy aborts a transaction still open. It is bound to the calling process
 * (TALLY_IOC_BEGIN) or to the calling process and every process it starts
 * (TALLY_IOC_BEGIN_TREE): their changes under the mount, through any descriptor, go into it.
 *
 *     #include <fcntl.h>
 *     #include <stdint.h>
 *     #include <sys/ioctl.h>
 *     #include "tally.h"
 *
 *     int dir = open("/mnt/tally", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
 *     uint64_t id;
 *     if (ioctl(dir, TALLY_IOC_BEGIN, &id) < 0) { perror("begin"); ... } // ENOTTY: not Tally
 *     ... write, create, rename, unlink files under /mnt/tally ...
 *     if (ok)
 *         ioctl(dir, TALLY_IOC_COMMIT_DURABLE);  // all of it, on stable media, or none
 *     else
 *         ioctl(dir, TALLY_IOC_ABORT);           // all of it undone
 *     close(dir);
 *
 * Errors (errno): ENOTTY not on a Tally mount; EBUSY a transaction is already open for this
 * file or this caller (begin), or an object is held by another transaction; EINVAL this open
 * file owns no transaction (commit/abort); ENOSPC the transaction did not fit and was aborted;
 * EIO an I/O error (the mount is read-only until remounted).
 */
#ifndef TALLY_H
#define TALLY_H

#include <stdint.h>
#include <linux/ioctl.h>

/* The type byte of every Tally ioctl. */
#define TALLY_IOC_MAGIC 0xB7

/* Begin a transaction bound to the calling process; writes its id (never 0). */
#define TALLY_IOC_BEGIN _IOR(TALLY_IOC_MAGIC, 1, uint64_t)
/* Begin a transaction bound to the calling process and all its descendants; writes its id.
 * Call prctl(PR_SET_CHILD_SUBREAPER, 1) first so orphaned descendants stay in the tree. */
#define TALLY_IOC_BEGIN_TREE _IOR(TALLY_IOC_MAGIC, 2, uint64_t)
/* Commit the transaction this open file owns: ordered and atomic, not yet durable. */
#define TALLY_IOC_COMMIT _IO(TALLY_IOC_MAGIC, 3)
/* Commit and wait until it is on stable media. */
#define TALLY_IOC_COMMIT_DURABLE _IO(TALLY_IOC_MAGIC, 4)
/* Abort the transaction this open file owns: every change undone, nothing written. */
#define TALLY_IOC_ABORT _IO(TALLY_IOC_MAGIC, 5)
/* Barrier on this file: later changes to any file survive a crash only if its earlier ones do. */
#define TALLY_IOC_BARRIER _IO(TALLY_IOC_MAGIC, 6)
/* The id of the transaction the caller's changes go into, 0 if none. */
#define TALLY_IOC_CURRENT _IOR(TALLY_IOC_MAGIC, 7, uint64_t)
/* Make everything committed on the whole mount durable: what sync(2) and syncfs(2) promise,
 * which Linux does not forward to FUSE servers. */
#define TALLY_IOC_SYNC _IO(TALLY_IOC_MAGIC, 8)

#endif /* TALLY_H */
