//! A [`CrashDevice`] that keeps a [`CrashPoint`] after every submit, wait and flush while
//! recording is on: the crash points *inside* an operation (between its device operations),
//! which the explorers and the crash tests check besides the points between operations.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tally_media::{Device, DeviceStats, Geometry, Ticket, Write, WriteFlags};

use super::{CrashDevice, CrashPoint};

/// A crash device that records crash points as it is used.
pub struct RecordingDevice {
    inner: CrashDevice,
    /// `None` while not recording.
    points: Mutex<Option<Vec<CrashPoint>>>,
}

impl RecordingDevice {
    /// Wrap `inner`; recording starts off.
    #[must_use]
    pub fn new(inner: CrashDevice) -> Arc<RecordingDevice> {
        Arc::new(RecordingDevice { inner, points: Mutex::new(None) })
    }

    /// The device underneath (its images, its crash point now).
    #[must_use]
    pub fn inner(&self) -> &CrashDevice {
        &self.inner
    }

    /// Start (dropping what was recorded) or stop recording.
    pub fn set_recording(&self, on: bool) {
        *self.guard() = on.then(Vec::new);
    }

    /// The points recorded since recording started; recording stops.
    pub fn take_points(&self) -> Vec<CrashPoint> {
        self.guard().take().unwrap_or_default()
    }

    fn guard(&self) -> MutexGuard<'_, Option<Vec<CrashPoint>>> {
        self.points.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self) {
        if let Some(points) = self.guard().as_mut() {
            points.push(self.inner.crash_point());
        }
    }
}

impl Device for RecordingDevice {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn read(&self, block: u64, buf: &mut [u8]) -> tally_media::Result<()> {
        self.inner.read(block, buf)
    }
    fn submit(&self, writes: Vec<Write>, flags: WriteFlags) -> tally_media::Result<Ticket> {
        let t = self.inner.submit(writes, flags);
        self.record();
        t
    }
    fn wait(&self, ticket: Ticket) -> tally_media::Result<()> {
        let r = self.inner.wait(ticket);
        self.record();
        r
    }
    fn flush(&self) -> tally_media::Result<()> {
        let r = self.inner.flush();
        self.record();
        r
    }
    fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }
}
