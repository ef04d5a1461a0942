//! Small SQLite transactions against one database file, for `bench/sqlite_mount.sh`: each
//! commit inserts or updates 1–4 rows of about 100 bytes, `synchronous=FULL`, in the journal
//! mode given. Prints `commits N seconds S` after a warm-up of 50 commits.
//!
//! ```text
//! sqlite_commits DB delete|wal SECONDS
//! ```
//!
//! The SQLite is this workspace's (bundled, `SQLITE_ENABLE_BATCH_ATOMIC_WRITE`): on a Tally
//! mount answering F2FS's atomic-write ioctls, `delete` commits batch-atomically (no journal).

use std::time::{Duration, Instant};

use rusqlite::Connection;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [db, mode, seconds] = args.as_slice() else {
        eprintln!("usage: sqlite_commits DB delete|wal SECONDS");
        std::process::exit(2);
    };
    let window = Duration::from_secs_f64(seconds.parse().expect("SECONDS"));
    let mut c = Connection::open(db).expect("open");
    c.pragma_update(None, "journal_mode", mode).expect("journal_mode");
    c.pragma_update(None, "synchronous", "FULL").expect("synchronous");
    c.execute_batch("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v BLOB)").expect("t");
    let mut rng = fastrand::Rng::with_seed(17);
    let mut commit = |c: &mut Connection, next: &mut i64| {
        let t = c.transaction().expect("begin");
        for _ in 0..rng.usize(1..=4) {
            if *next > 100 && rng.bool() {
                let id = rng.i64(1..*next);
                t.execute("UPDATE t SET v = randomblob(100) WHERE id = ?1", [id]).expect("up");
            } else {
                t.execute("INSERT INTO t VALUES (?1, randomblob(100))", [*next]).expect("in");
                *next += 1;
            }
        }
        t.commit().expect("commit");
    };
    let mut next = 1;
    for _ in 0..50 {
        commit(&mut c, &mut next);
    }
    let start = Instant::now();
    let mut commits = 0u64;
    while start.elapsed() < window {
        commit(&mut c, &mut next);
        commits += 1;
    }
    println!("commits {commits} seconds {:.3}", start.elapsed().as_secs_f64());
}
