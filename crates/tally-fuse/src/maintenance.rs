//! The mount's maintenance thread: durability on every interval, cleaning out of the
//! foreground.
//!
//! Every [`MountConfig::maintenance_interval`] the thread makes committed changes durable
//! ([`Fs::maintain_durability`]): never deferred, since how long a change may stay volatile is
//! part of the contract (docs/FS.md, "Write-behind and the commit interval"). A round of
//! cleaning ahead of need ([`Fs::maintain`], which makes durable and then cleans) becomes due
//! at the same moments, and runs as soon as one of these holds:
//! - the mount is idle: no request arrived for [`MountConfig::clean_idle`];
//! - space is low: less than a quarter of the log's segments is free, where `Fs::maintain`
//!   starts cleaning for space (deferring further would leave it to the operations, which
//!   clean for themselves, in the foreground, once space runs out);
//! - it has been due for [`MountConfig::clean_defer_max`], so a mount that is never idle still
//!   cleans.
//!
//! Cleaning while requests arrive competes with them for the state lock and the device (the
//! round that cleaned what an `rm -rf` freed made the `git status` after it 2-4x slower,
//! docs/bench/mount.md); after a pause nothing waits for it.
//!
//! Invariants:
//! - a durability round runs every interval whatever the requests (a cleaning round makes
//!   durable too, first);
//! - idleness costs requests nothing: the thread samples the adapter's request counts (one
//!   relaxed add per request, which both transports already do, `requests.rs`); the mount has
//!   been idle since the first sample that saw the current total. A request still being served
//!   counted at its start, so one that runs longer than `clean_idle` looks idle;
//! - with `clean_idle` zero, cleaning runs whenever it is due (the behaviour before back-off).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use tally_fs::{Fs, MaintainReport};

use crate::requests::RequestCounts;

/// When cleaning runs, apart from durability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    /// Durability rounds, and cleaning becoming due ([`MountConfig::maintenance_interval`]).
    pub interval: Duration,
    /// How long no request must arrive before due cleaning runs (zero: at once).
    pub idle: Duration,
    /// How long due cleaning may wait for the mount to be idle.
    pub defer_max: Duration,
}

/// Why a cleaning round ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    Idle,
    SpaceLow,
    Overdue,
}

/// Whether due cleaning runs now, and why: `due_for` is how long it has been due, `quiet_for`
/// how long no request has arrived.
pub(crate) fn clean_now(
    policy: &Policy,
    due_for: Duration,
    quiet_for: Duration,
    space_low: bool,
) -> Option<Why> {
    if quiet_for >= policy.idle {
        Some(Why::Idle)
    } else if space_low {
        Some(Why::SpaceLow)
    } else if due_for >= policy.defer_max {
        Some(Why::Overdue)
    } else {
        None
    }
}

/// What the maintenance thread did since the mount (live; [`crate::Mounted::maintenance`]).
#[derive(Debug, Default)]
pub struct MaintenanceCounts {
    durability_rounds: AtomicU64,
    synced_rounds: AtomicU64,
    deferrals: AtomicU64,
    cleaned_idle: AtomicU64,
    cleaned_space_low: AtomicU64,
    cleaned_overdue: AtomicU64,
    segments_freed: AtomicU64,
}

impl MaintenanceCounts {
    /// Rounds that made changes durable without cleaning.
    pub fn durability_rounds(&self) -> u64 {
        self.durability_rounds.load(Ordering::Relaxed)
    }

    /// Rounds (with or without cleaning) that found committed changes to make durable.
    pub fn synced_rounds(&self) -> u64 {
        self.synced_rounds.load(Ordering::Relaxed)
    }

    /// Intervals at which cleaning was due and deferred because requests were arriving.
    pub fn deferrals(&self) -> u64 {
        self.deferrals.load(Ordering::Relaxed)
    }

    /// Cleaning rounds run once the mount was idle.
    pub fn cleaned_idle(&self) -> u64 {
        self.cleaned_idle.load(Ordering::Relaxed)
    }

    /// Cleaning rounds run while busy because space was low.
    pub fn cleaned_space_low(&self) -> u64 {
        self.cleaned_space_low.load(Ordering::Relaxed)
    }

    /// Cleaning rounds run while busy because they had waited [`MountConfig::clean_defer_max`].
    pub fn cleaned_overdue(&self) -> u64 {
        self.cleaned_overdue.load(Ordering::Relaxed)
    }

    /// Segments the cleaning rounds returned to the free pool.
    pub fn segments_freed(&self) -> u64 {
        self.segments_freed.load(Ordering::Relaxed)
    }

    fn record(&self, report: MaintainReport, why: Option<Why>) {
        let add = |c: &AtomicU64, n: u64| c.fetch_add(n, Ordering::Relaxed);
        add(&self.synced_rounds, u64::from(report.synced));
        match why {
            None => add(&self.durability_rounds, 1),
            Some(Why::Idle) => add(&self.cleaned_idle, 1),
            Some(Why::SpaceLow) => add(&self.cleaned_space_low, 1),
            Some(Why::Overdue) => add(&self.cleaned_overdue, 1),
        };
        add(&self.segments_freed, u64::from(report.segments_freed));
    }
}

impl std::fmt::Display for MaintenanceCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "durability rounds {} (synced {}), cleaning deferred {} times, cleaned when idle {}, \
             space low {}, overdue {}, segments freed {}",
            self.durability_rounds(),
            self.synced_rounds(),
            self.deferrals(),
            self.cleaned_idle(),
            self.cleaned_space_low(),
            self.cleaned_overdue(),
            self.segments_freed()
        )
    }
}

/// The thread; stops (and is joined) when dropped, or by itself once the file system is
/// dropped or a round fails.
pub(crate) struct Maintenance {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Maintenance {
    /// Start the thread. It holds only a weak reference to the file system.
    pub(crate) fn spawn(
        fs: &Arc<Fs>,
        policy: Policy,
        requests: Arc<RequestCounts>,
        counts: Arc<MaintenanceCounts>,
    ) -> Maintenance {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = stop.clone();
        let weak = Arc::downgrade(fs);
        let thread = std::thread::Builder::new()
            .name("tally-maintain".into())
            .spawn(move || run(&weak, policy, &requests, &counts, &flag))
            .map_err(|e| tracing::error!("no maintenance thread: {e}"))
            .ok();
        Maintenance { stop, thread }
    }
}

impl Drop for Maintenance {
    fn drop(&mut self) {
        let (m, cv) = &*self.stop;
        *m.lock().unwrap_or_else(PoisonError::into_inner) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Wait until `until` or until stopped; true when stopped.
fn stopped_before(flag: &(Mutex<bool>, Condvar), until: Instant) -> bool {
    let (m, cv) = flag;
    let timeout = until.saturating_duration_since(Instant::now());
    let guard = m.lock().unwrap_or_else(PoisonError::into_inner);
    let (guard, _) = cv
        .wait_timeout_while(guard, timeout, |stopped| !*stopped)
        .unwrap_or_else(PoisonError::into_inner);
    *guard
}

fn requests_total(requests: &RequestCounts) -> u64 {
    requests.snapshot().total()
}

fn run(
    weak: &Weak<Fs>,
    policy: Policy,
    requests: &RequestCounts,
    counts: &MaintenanceCounts,
    flag: &(Mutex<bool>, Condvar),
) {
    // While cleaning is due the thread looks at the requests this often: a cleaning round
    // starts at most a quarter of `idle` late.
    let poll = (policy.idle / 4).max(Duration::from_millis(5));
    let mut next_round = Instant::now() + policy.interval;
    let mut due_since: Option<Instant> = None;
    let mut seen = requests_total(requests);
    let mut quiet_since = Instant::now();
    loop {
        let wake = match due_since {
            Some(_) => next_round.min(Instant::now() + poll),
            None => next_round,
        };
        if stopped_before(flag, wake) {
            return;
        }
        let now = Instant::now();
        let total = requests_total(requests);
        if total != seen {
            seen = total;
            quiet_since = now;
        }
        let round = now >= next_round;
        if round && due_since.is_none() {
            due_since = Some(now);
        }
        let Some(since) = due_since else { continue };
        let Some(fs) = weak.upgrade() else { return };
        let log = fs.log();
        // Where `Fs::maintain` starts cleaning for space (docs/FS.md, "Cleaning").
        let space_low = u64::from(log.free_segments()) * 4 < u64::from(log.segment_count());
        let why = clean_now(
            &policy,
            now.saturating_duration_since(since),
            now.saturating_duration_since(quiet_since),
            space_low,
        );
        let done = match why {
            Some(_) => fs.maintain(),
            None if round => {
                // Counted once per interval that finds cleaning waiting, not once per poll.
                counts.deferrals.fetch_add(1, Ordering::Relaxed);
                fs.maintain_durability()
            }
            None => continue,
        };
        match done {
            Ok(report) => {
                counts.record(report, why);
                if why.is_some() {
                    due_since = None;
                    tracing::debug!(?why, segments_freed = report.segments_freed, "cleaned");
                }
            }
            Err(e) => {
                tracing::error!("background maintenance failed: {e}");
                return;
            }
        }
        if round {
            next_round = Instant::now() + policy.interval;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const NONE: Duration = Duration::ZERO;

    fn policy() -> Policy {
        Policy { interval: 100 * MS, idle: 500 * MS, defer_max: 30_000 * MS }
    }

    #[test]
    fn cleaning_waits_for_idle_unless_space_is_low_or_it_waited_too_long() {
        let p = policy();
        assert_eq!(clean_now(&p, NONE, 499 * MS, false), None);
        assert_eq!(clean_now(&p, 29_999 * MS, NONE, false), None);
        assert_eq!(clean_now(&p, NONE, 500 * MS, false), Some(Why::Idle));
        assert_eq!(clean_now(&p, NONE, NONE, true), Some(Why::SpaceLow));
        assert_eq!(clean_now(&p, 30_000 * MS, NONE, false), Some(Why::Overdue));
        // No back-off: cleaning runs whenever it is due.
        let eager = Policy { idle: Duration::ZERO, ..p };
        assert_eq!(clean_now(&eager, NONE, NONE, false), Some(Why::Idle));
    }

    #[test]
    fn counts_say_what_ran() {
        let c = MaintenanceCounts::default();
        let synced = MaintainReport { synced: true, ..MaintainReport::default() };
        c.record(synced, None);
        c.record(
            MaintainReport { segments_freed: 3, ..MaintainReport::default() },
            Some(Why::Idle),
        );
        c.record(synced, Some(Why::Overdue));
        assert_eq!((c.durability_rounds(), c.synced_rounds()), (1, 2));
        assert_eq!((c.cleaned_idle(), c.cleaned_space_low(), c.cleaned_overdue()), (1, 0, 1));
        assert_eq!(c.segments_freed(), 3);
    }
}
