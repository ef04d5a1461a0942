//! Multithreaded model-based test (issue 16): several threads run seeded random operations on
//! one shared tree at once; every call and return is stamped from one global counter, and the
//! history must be **linearizable** against a reference model: some total order of the
//! operations, consistent with real time (an operation that returned before another was
//! called comes first), in which the model, run sequentially, gives every operation exactly
//! the result the file system returned.
//!
//! The checker is Wing & Gong's search with memoisation (as in Lowe's and Porcupine's
//! checkers): from the set of operations linearized so far and the model's state, try each
//! operation that may come next — one no unlinearized operation returned before the call of —
//! apply it to the model, and recurse if the model's result is the one observed; a (set,
//! state) pair that failed once is not searched again. It is sound (a history it accepts has
//! the order it found; `linearization` returns it) and complete for the histories it is given
//! (it tries every order real time allows). Histories are kept small (3 threads × 6
//! operations per round, many rounds), so the search is short.
//!
//! The tree: two fixed directories `d0` and `d1` (never moved or removed), where the threads
//! create, mkdir, unlink, rmdir, rename (within and across the two, onto files and empty
//! directories) and link, over three names so operations collide; two fixed files `f0` and
//! `f1` in the root that the threads write, read, link into the directories (so unlinks change
//! their link counts) and write inside explicit transactions together with a create (the
//! transaction commits, or aborts when a step fails). Readers see a transaction's changes as
//! they happen (no isolation of readers, `docs/TRANSACTIONS.md`), so a transaction is recorded
//! as its calls — begin and write, create, commit or abort — each linearizable on its own, an
//! abort undoing exactly the transaction's changes in one step, and another transaction's
//! `EBUSY` allowed only while one holds what it touches; lookups,
//! readdirs and getattrs (sizes, link counts, directories' counts included) observe it all.
//! Inode numbers of created objects are the file system's: the model takes them from the
//! create's result and checks them wherever they are observed.
//!
//! It can fail: `the_checker_rejects_a_wrong_model` runs recorded histories against a model
//! whose rename keeps the old name and must reject some; `the_checker_rejects_a_torn_rename`
//! hands it a history in which a rename was seen half done (the name in neither directory)
//! and must reject it, while accepting the same history with the name seen arriving.

mod linearize;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use linearize::{
    describe, fresh, linearization, observe_final, overlapping_pairs, random_op, run_op, run_txn,
    Event, Fixed, Op, Ret, Variant,
};
use tally_fs::{Fs, Ino};

const THREADS: usize = 3;
const OPS_PER_THREAD: usize = 6;
/// Rounds at most, and the time they may take (whichever comes first; at least `ROUNDS_MIN`).
const ROUNDS_MAX: usize = 3000;
const ROUNDS_MIN: usize = 50;
const TIME_MAX: Duration = Duration::from_secs(15);

/// One round: a fresh file system, `THREADS` threads each running its seeded operations,
/// started together; the history, in no particular order.
fn round(seed: u64) -> (Fixed, Vec<Event>, Arc<Fs>) {
    let (fs, fx) = fresh();
    let clock = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (fs, clock, start) = (fs.clone(), clock.clone(), start.clone());
            std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(seed ^ ((t as u64 + 1) * 0x9E37_79B9));
                let ops: Vec<Op> = (0..OPS_PER_THREAD)
                    .map(|k| random_op(&mut rng, (1 + t * OPS_PER_THREAD + k) as u8))
                    .collect();
                // In odd rounds the threads meet before every operation, so operations of the
                // same index start together (the OS alone runs short operations mostly one
                // after another); in even rounds only at the start, so any operation can
                // overlap any other.
                let lockstep = seed % 2 == 1;
                start.wait();
                let mut events = Vec::new();
                for (k, op) in ops.into_iter().enumerate() {
                    if lockstep && k > 0 {
                        start.wait();
                    }
                    if matches!(op, Op::Txn { .. }) {
                        events.extend(run_txn(&fs, fx, t, &op, &clock));
                        continue;
                    }
                    let call = clock.fetch_add(1, Ordering::SeqCst);
                    let ret = run_op(&fs, fx, &op);
                    let done = clock.fetch_add(1, Ordering::SeqCst);
                    events.push(Event { thread: t, op, ret, call, done });
                }
                events
            })
        })
        .collect();
    let history = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    (fx, history, fs)
}

fn base_seed() -> u64 {
    std::env::var("TALLY_LIN_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x11AE_A216_u64)
}

/// Every round's history, with the final state observed after it, is linearizable, and `fsck`
/// is clean.
#[test]
fn concurrent_histories_are_linearizable() {
    let seed = base_seed();
    let started = Instant::now();
    let (mut rounds, mut overlaps, mut busy) = (0usize, 0usize, 0usize);
    while rounds < ROUNDS_MAX && (rounds < ROUNDS_MIN || started.elapsed() < TIME_MAX) {
        let s = seed.wrapping_add(rounds as u64);
        let (fx, h, fs) = round(s);
        // The final state, observed once every thread is done, is part of the history.
        let mut h = h;
        observe_final(&fs, fx, &mut h, THREADS);
        if linearization(fx, &h, Variant::Right).is_none() {
            panic!(
                "round seed {s} (TALLY_LIN_SEED={seed}, round {rounds}): not linearizable:\n{}",
                describe(&h)
            );
        }
        assert!(fs.fsck().is_clean(), "seed {s}: {:?}", fs.fsck().problems);
        overlaps += overlapping_pairs(&h);
        busy += h.iter().filter(|e| e.ret == Ret::Err("EBUSY")).count();
        rounds += 1;
    }
    println!(
        "{rounds} rounds of {THREADS}x{OPS_PER_THREAD} operations linearizable in {:.1} s; \
         {overlaps} overlapping pairs of operations, {busy} EBUSY",
        started.elapsed().as_secs_f64()
    );
    // Without overlap the test would check sequential histories only. How much the OS
    // overlaps varies with the load: 300-15,000 pairs in 3,000 rounds on 2 busy cores
    // without the lockstep rounds, 2,300-2,900 with them; tests/shuttle.rs's
    // `linearizable_history` overlaps operations by construction.
    assert!(
        overlaps * 10 > rounds,
        "too little concurrency: {overlaps} overlaps in {rounds} rounds"
    );
}

/// Two wrong models — a rename that keeps the old name, an abort that keeps the transaction's
/// writes — must each be rejected on some recorded histories (else the checker accepts
/// anything).
#[test]
fn the_checker_rejects_a_wrong_model() {
    const ROUNDS: u64 = 200;
    let seed = base_seed();
    let wrong = [Variant::RenameKeepsSource, Variant::AbortKeepsWrites];
    let mut rejected = [0; 2];
    for k in 0..ROUNDS {
        let (fx, h, _fs) = round(seed.wrapping_add(10_000 + k));
        assert!(linearization(fx, &h, Variant::Right).is_some(), "round {k}");
        for (n, v) in rejected.iter_mut().zip(wrong) {
            *n += usize::from(linearization(fx, &h, v).is_none());
        }
    }
    let aborts = "aborted writes kept";
    println!("wrong models rejected on {rejected:?} of {ROUNDS} histories (renames, {aborts})");
    assert!(rejected[0] > 0, "the checker accepted every history with renames keeping the source");
    assert!(rejected[1] > 0, "the checker accepted every history with aborts keeping writes");
}

/// A history where a rename from `d0` to `d1` is seen half done — while it runs, one thread
/// sees the name gone from `d0` and then not yet in `d1` — is not linearizable; the same
/// history with the name seen in `d1` is.
#[test]
fn the_checker_rejects_a_torn_rename() {
    let fx = Fixed { dirs: [10, 11], files: [12, 13] };
    let a = 20;
    let ev = |thread, op, ret, call, done| Event { thread, op, ret, call, done };
    let history = |seen_in_d1: Vec<(Vec<u8>, Ino, bool)>| {
        vec![
            ev(0, Op::Create { dir: 0, name: 0 }, Ret::Ino(a), 0, 1),
            ev(0, Op::Rename { from: (0, 0), to: (1, 0) }, Ret::Ok, 2, 9),
            ev(1, Op::Readdir { dir: 0 }, Ret::Entries(vec![]), 3, 4),
            ev(1, Op::Readdir { dir: 1 }, Ret::Entries(seen_in_d1), 5, 6),
        ]
    };
    let torn = history(vec![]);
    assert!(linearization(fx, &torn, Variant::Right).is_none(), "a torn rename was accepted");
    let whole = history(vec![(b"a".to_vec(), a, false)]);
    assert!(linearization(fx, &whole, Variant::Right).is_some(), "an atomic rename was rejected");
    // And real time is respected: the rename seen done before it was called is rejected.
    let early = vec![
        ev(0, Op::Create { dir: 0, name: 0 }, Ret::Ino(a), 0, 1),
        ev(1, Op::Readdir { dir: 1 }, Ret::Entries(vec![(b"a".to_vec(), a, false)]), 2, 3),
        ev(0, Op::Rename { from: (0, 0), to: (1, 0) }, Ret::Ok, 4, 5),
    ];
    assert!(linearization(fx, &early, Variant::Right).is_none(), "real-time order ignored");
}
