//! Deliberately broken variants of the persistence protocol, to prove that the crash tests
//! catch what they claim to catch. They take effect only in a build with the `mutants` feature;
//! elsewhere asking for one is refused with [`crate::PmemLogError::BadConfig`].

/// A deliberately broken variant of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutant {
    /// Classic commit stores its 8-byte commit word without the fence that orders it after the
    /// units: the watermark can be durable before the data it covers.
    MissingFenceBeforeWatermark,
    /// The non-temporal copy stores the unaligned tail of a unit with cached stores and never
    /// flushes it (NOVA's bug): the fence does not make it durable.
    NtCopySkipsUnalignedTail,
    /// Recovery accepts units — larger than the 8-byte failure-atomic unit — without checking
    /// their crc: a unit whose header persisted but not all its payload lines is taken whole.
    UnitLargerThanAtomicWithoutCrc,
}

impl Mutant {
    /// Every mutant.
    pub const ALL: [Mutant; 3] = [
        Mutant::MissingFenceBeforeWatermark,
        Mutant::NtCopySkipsUnalignedTail,
        Mutant::UnitLargerThanAtomicWithoutCrc,
    ];

    /// The mutant's name, as in the issue.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Mutant::MissingFenceBeforeWatermark => "missing-fence-before-watermark",
            Mutant::NtCopySkipsUnalignedTail => "nt-copy-skips-unaligned-tail",
            Mutant::UnitLargerThanAtomicWithoutCrc => "unit-larger-than-atomic-without-crc",
        }
    }

    /// The mutant called `name`.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// Whether this build has the `mutants` feature.
#[must_use]
pub fn available() -> bool {
    cfg!(feature = "mutants")
}

/// Whether `m` is the active mutant (always false without the feature).
#[inline]
pub(crate) fn is(active: Option<Mutant>, m: Mutant) -> bool {
    cfg!(feature = "mutants") && active == Some(m)
}
