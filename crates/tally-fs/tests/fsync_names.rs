//! Durability of names (docs/FS.md): a durable wait makes every namespace change committed
//! before it durable — whatever stream it is on — and nothing else of other files.
//!
//! SQLite in DELETE journal mode commits by unlinking its journal, a change of the root
//! directory that it never fsyncs; the commits after it fsync the database file only. If a
//! crash keeps those later commits without the unlink, SQLite finds a hot journal and rolls the
//! database back over acknowledged commits (`docs/bench/fs.md`, "hot journal"). Here the
//! database is `db` (its own stream), the journal `j` (its entry on the root's stream), and
//! an unrelated file `x` (a third stream) is written and never synced. With write-behind on,
//! what a durable wait does not write out stays in memory, and dropping the file system
//! without unmount loses it: the remount shows exactly what the waits made durable.
//!
//! The `namespace-not-ordered` mutant (namespace changes not made barriers) loses the unlink;
//! without the narrow waits (a flush round writing out every stream) `x` survives too.

use std::sync::Arc;

use tally_fs::{Fs, FsMutant, MkfsOptions, MountOptions, Owner, StreamPolicy, ROOT};
use tally_log::WriteBehind;
use tally_media::{Device, MemDevice};

const ME: Owner = Owner { uid: 1000, gid: 1000 };
/// Streams at mkfs: six of them take fresh writes (`Fs::stream_of`: inode % 6).
const STREAMS: u16 = 8;
const FRESH: u64 = 6;

fn options(mutant: Option<FsMutant>) -> MountOptions {
    // Nothing written out but by durable waits: large buffers, no commit interval.
    let behind = WriteBehind {
        interval: None,
        stream_bytes_max: 64 << 20,
        memory_bytes_max: 256 << 20,
        ..WriteBehind::default()
    };
    MountOptions {
        streams: StreamPolicy::PerFile,
        mutant,
        write_behind: Some(behind),
        ..MountOptions::default()
    }
}

/// What the remount after the crash shows.
#[derive(Debug, PartialEq, Eq)]
struct After {
    /// `j` is still named.
    journal: bool,
    /// `k` (unlinked before an fsync of `db` with no change of `db` after it) is still named.
    second_journal: bool,
    /// `x`'s size (its unsynced write lost: 0).
    x_size: u64,
    /// `db`'s size.
    db_size: u64,
    /// The durable watermark of `x`'s stream moved during `db`'s fsyncs.
    x_stream_flushed: bool,
}

fn run(mutant: Option<FsMutant>) -> After {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 8192).unwrap());
    Fs::mkfs(dev.clone(), &MkfsOptions { streams: STREAMS, segment_blocks: 256, uuid: None })
        .unwrap();
    let fs = Fs::mount(dev.clone(), options(mutant)).unwrap();
    let page = vec![7u8; 4096];
    let j = fs.create(None, ROOT, b"j", 0o644, ME).unwrap().ino;
    let db = fs.create(None, ROOT, b"db", 0o644, ME).unwrap().ino;
    let x = fs.create(None, ROOT, b"x", 0o644, ME).unwrap().ino;
    let k = fs.create(None, ROOT, b"k", 0o644, ME).unwrap().ino;
    let stream = |ino: u64| u16::try_from(ino % FRESH).unwrap();
    let root = stream(ROOT);
    assert!(
        root != stream(db) && root != stream(x) && stream(db) != stream(x),
        "the root, db and x must be on three streams"
    );
    fs.sync().unwrap();
    // The journal written and fsynced, the database written and fsynced.
    fs.write(None, j, 0, &page).unwrap();
    fs.fsync(j).unwrap();
    fs.write(None, db, 0, &page).unwrap();
    fs.fsync(db).unwrap();
    // The commit point: the journal's unlink, never fsynced. An unrelated file written.
    fs.unlink(None, ROOT, b"j").unwrap();
    fs.write(None, x, 0, &page).unwrap();
    let x_durable = fs.log().durable_seq(stream(x));
    // The next transaction: only the database, written and fsynced.
    fs.write(None, db, 4096, &page).unwrap();
    fs.fsync(db).unwrap();
    // A second unlink, then a durable wait on the database with no change of it after.
    fs.unlink(None, ROOT, b"k").unwrap();
    fs.fsync(db).unwrap();
    let x_stream_flushed = fs.log().durable_seq(stream(x)) != x_durable;
    drop(fs); // a crash: what is still buffered is lost
    let fs = Fs::mount(dev, MountOptions::default()).unwrap();
    let after = After {
        journal: fs.lookup(ROOT, b"j").is_ok(),
        second_journal: fs.lookup(ROOT, b"k").is_ok(),
        x_size: fs.getattr(x).unwrap().size,
        db_size: fs.getattr(db).unwrap().size,
        x_stream_flushed,
    };
    let report = fs.fsck();
    assert!(report.is_clean(), "{:?}", report.problems);
    let _ = k;
    after
}

/// The unlinks are durable with the database's later fsyncs; `x`'s unsynced write is neither
/// written out nor kept.
#[test]
fn a_durable_wait_takes_earlier_namespace_changes_along_and_nothing_else() {
    let after = run(None);
    assert_eq!(
        after,
        After {
            journal: false,
            second_journal: false,
            x_size: 0,
            db_size: 8192,
            x_stream_flushed: false
        }
    );
}

/// With namespace changes not made barriers, the unlink is lost under the acknowledged
/// database commit after it (SQLite would find a hot journal).
#[cfg_attr(not(feature = "mutants"), ignore = "needs the mutants feature")]
#[test]
fn namespace_changes_not_ordered_are_caught() {
    #[cfg(feature = "mutants")]
    {
        let after = run(Some(FsMutant::NamespaceNotOrdered));
        assert!(after.journal && after.second_journal, "the mutant was not caught: {after:?}");
        assert_eq!(after.db_size, 8192);
    }
}
