//! SQLite on a `tally mount` daemon killed with SIGKILL under it: the batch-atomic commits
//! (SQLite built with `SQLITE_ENABLE_BATCH_ATOMIC_WRITE`, committing through F2FS's ioctls,
//! each `COMMIT_ATOMIC_WRITE` one durable Tally transaction) that returned are all there after
//! the image is mounted again, the database passes `integrity_check`, and the balances add up.
//! Several rounds, each killed at a seeded moment, each starting from the last one's recovery.
//!
//! Needs root and /dev/fuse (fails under `CI=true` without them).

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};

use common::{code, mkfs_in, mount_daemon_pid, require_fuse, scratch, sigkill, tally, text};

const ACCOUNTS: i64 = 100;
const OPENING_BALANCE: i64 = 1000;
/// Daemon kills (each round a mount, SQLite commits, a SIGKILL at a seeded moment).
const ROUNDS: u32 = 20;

fn open(db: &Path) -> rusqlite::Result<Connection> {
    let c = Connection::open(db)?;
    c.pragma_update(None, "journal_mode", "DELETE")?;
    c.pragma_update(None, "synchronous", "FULL")?;
    Ok(c)
}

/// The number of transfers in the history, after checking integrity and the balances.
fn check(db: &Path) -> i64 {
    let c = open(db).unwrap();
    let ok: String = c.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
    assert_eq!(ok, "ok");
    let sum: i64 = c.query_row("SELECT SUM(bal) FROM acct", [], |r| r.get(0)).unwrap();
    assert_eq!(sum, ACCOUNTS * OPENING_BALANCE);
    let (n, max): (i64, Option<i64>) = c
        .query_row("SELECT COUNT(*), MAX(n) FROM hist", [], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap();
    assert_eq!(n, max.unwrap_or(0), "the history has a gap");
    n
}

#[test]
fn every_returned_commit_survives_a_daemon_kill() {
    require_fuse!();
    let dir = scratch("sqlite-daemon-kill", "rounds");
    let (image, mnt, log) = mkfs_in(&dir, "256M");
    let db = mnt.join("bank.db");
    let mut rng = fastrand::Rng::with_seed(0x17);
    let mut acked: i64 = 0;
    for round in 0..ROUNDS {
        let (pid, guard) = mount_daemon_pid(&image, &mnt, &log);
        if round == 0 {
            let mut c = open(&db).unwrap();
            let t = c.transaction().unwrap();
            t.execute_batch(
                "CREATE TABLE acct(id INTEGER PRIMARY KEY, bal INTEGER, pad BLOB);
                 CREATE TABLE hist(n INTEGER PRIMARY KEY, src INTEGER, dst INTEGER, amt INTEGER);",
            )
            .unwrap();
            for id in 0..ACCOUNTS {
                t.execute("INSERT INTO acct VALUES (?1, ?2, zeroblob(300))", [id, OPENING_BALANCE])
                    .unwrap();
            }
            t.commit().unwrap();
        }
        // Every commit that returned before the kill must be there after it; the one in flight
        // may be there or not.
        let found = check(&db);
        assert!(
            found == acked || found == acked + 1,
            "round {round}: {acked} commits returned, {found} recovered"
        );
        acked = found;
        let delay = Duration::from_millis(rng.u64(100..600));
        let killed = Arc::new(AtomicBool::new(false));
        let killer = {
            let killed = killed.clone();
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                sigkill(pid);
                killed.store(true, Ordering::Release);
            })
        };
        let mut c = open(&db).unwrap();
        let mut wrote = 0;
        let failure = loop {
            let (src, dst, amt) = (rng.i64(0..ACCOUNTS), rng.i64(0..ACCOUNTS), rng.i64(1..50));
            let r = (|| {
                let t = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
                t.execute("UPDATE acct SET bal = bal - ?2 WHERE id = ?1", [src, amt])?;
                t.execute("UPDATE acct SET bal = bal + ?2 WHERE id = ?1", [dst, amt])?;
                t.execute("INSERT INTO hist VALUES (?1, ?2, ?3, ?4)", [acked + 1, src, dst, amt])?;
                t.commit()
            })();
            match r {
                Ok(()) => {
                    acked += 1;
                    wrote += 1;
                }
                Err(e) => break e,
            }
        };
        killer.join().unwrap();
        assert!(killed.load(Ordering::Acquire), "round {round}: failed before the kill: {failure}");
        eprintln!("round {round}: killed after {delay:?}, {wrote} commits returned ({failure})");
        drop(c);
        let out = tally(&["umount", "--lazy"], &[&mnt]);
        assert_eq!(code(&out), 0, "{}", text(&out));
        drop(guard);
    }
    let (_pid, _guard) = mount_daemon_pid(&image, &mnt, &log);
    let found = check(&db);
    assert!(found == acked || found == acked + 1, "{acked} commits returned, {found} recovered");
    let out = tally(&["umount"], &[&mnt]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let _ = std::fs::remove_dir_all(&dir);
}
