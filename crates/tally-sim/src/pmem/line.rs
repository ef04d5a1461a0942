//! Pending stores of one cache line, as word pieces, and the contents a crash can leave.
//!
//! Invariants:
//! - a piece lies inside one aligned 8-byte word (its `mask` says which bytes), so a piece is
//!   never torn;
//! - `cached` is in program order; `cached[..flushed]` were covered by a flush since the last
//!   fence;
//! - no pending piece of the line is older than a durable piece that covers the same bytes (the
//!   fence masks such bytes out), so composing durable bytes then pieces in program order is
//!   the program's order.

use tally_media::pmem::{LINE_SIZE, WORD_SIZE};

/// Bytes of one line, as a fixed array (the last line of a region may use fewer).
pub(super) type LineBytes = [u8; LINE_SIZE as usize];

/// A store's part inside one 8-byte word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Piece {
    /// Program order of the store it came from (pieces of one store share it).
    pub(super) seq: u64,
    /// Word index within the line, `0..8`.
    pub(super) word: u8,
    /// Bit `i` set: byte `i` of the word is stored.
    pub(super) mask: u8,
    /// The word's bytes; only those in `mask` count.
    pub(super) bytes: [u8; WORD_SIZE as usize],
}

impl Piece {
    /// Apply to `line`.
    pub(super) fn apply(&self, line: &mut LineBytes) {
        let base = usize::from(self.word) * WORD_SIZE as usize;
        for i in 0..WORD_SIZE as usize {
            if self.mask & (1 << i) != 0 {
                line[base + i] = self.bytes[i];
            }
        }
    }
}

/// Split a store of `bytes` at region offset `off` into (line index, piece) in ascending
/// address order: the order the model persists a multi-word store within a line.
pub(super) fn split(off: u64, bytes: &[u8], seq: u64) -> Vec<(u64, Piece)> {
    let mut pieces: Vec<(u64, Piece)> = Vec::new();
    for (i, &byte) in bytes.iter().enumerate() {
        let at = off + i as u64;
        let line = at / LINE_SIZE;
        let word = ((at % LINE_SIZE) / WORD_SIZE) as u8;
        let byte_in_word = (at % WORD_SIZE) as usize;
        match pieces.last_mut() {
            Some((l, p)) if *l == line && p.word == word => {
                p.mask |= 1 << byte_in_word;
                p.bytes[byte_in_word] = byte;
            }
            _ => {
                let mut piece = Piece { seq, word, mask: 1 << byte_in_word, bytes: [0; 8] };
                piece.bytes[byte_in_word] = byte;
                pieces.push((line, piece));
            }
        }
    }
    pieces
}

/// The not-yet-durable stores of one line.
#[derive(Debug, Clone, Default)]
pub(super) struct LineState {
    /// Cached stores' pieces, program order; they persist as a prefix.
    pub(super) cached: Vec<Piece>,
    /// `cached[..flushed]` were flushed since the last fence.
    pub(super) flushed: usize,
    /// Non-temporal pieces since the last fence; each persists or not independently.
    pub(super) nt: Vec<Piece>,
}

impl LineState {
    /// Nothing pending.
    pub(super) fn is_empty(&self) -> bool {
        self.cached.is_empty() && self.nt.is_empty()
    }

    /// Number of (prefix length, non-temporal subset) choices a crash has for this line, if it
    /// fits in a `u64`.
    pub(super) fn choice_count(&self) -> Option<u64> {
        let subsets = 1u64.checked_shl(u32::try_from(self.nt.len()).ok()?)?;
        (self.cached.len() as u64 + 1).checked_mul(subsets)
    }

    /// The line a crash leaves when the first `prefix` cached pieces persisted (at most
    /// `cached.len()`) and the non-temporal pieces `nt[i]` for which `nt_present(i)`.
    pub(super) fn compose(
        &self,
        durable: &LineBytes,
        prefix: usize,
        nt_present: impl Fn(usize) -> bool,
    ) -> LineBytes {
        let prefix = prefix.min(self.cached.len());
        let mut chosen: Vec<&Piece> = self.cached[..prefix].iter().collect();
        chosen.extend(self.nt.iter().enumerate().filter(|(i, _)| nt_present(*i)).map(|(_, p)| p));
        chosen.sort_by_key(|p| p.seq);
        let mut line = *durable;
        for piece in chosen {
            piece.apply(&mut line);
        }
        line
    }

    /// Whether a pending non-temporal piece covers a byte that `piece` stores.
    pub(super) fn nt_overlaps(&self, piece: &Piece) -> bool {
        self.nt.iter().any(|p| p.word == piece.word && p.mask & piece.mask != 0)
    }

    /// A fence: flushed cached pieces and every non-temporal piece become durable (applied to
    /// `durable` in program order); the rest stay pending, minus bytes a newer durable piece
    /// covers.
    pub(super) fn fence(&mut self, durable: &mut LineBytes) {
        let mut landed: Vec<Piece> = self.cached.drain(..self.flushed).collect();
        landed.append(&mut self.nt);
        landed.sort_by_key(|p| p.seq);
        for piece in &landed {
            piece.apply(durable);
        }
        for rest in &mut self.cached {
            for newer in landed.iter().filter(|d| d.seq > rest.seq && d.word == rest.word) {
                rest.mask &= !newer.mask;
            }
        }
        self.cached.retain(|p| p.mask != 0);
        self.flushed = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_cuts_at_words_and_lines_in_address_order() {
        let pieces = split(60, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 3);
        let shape: Vec<(u64, u8, u8)> = pieces.iter().map(|(l, p)| (*l, p.word, p.mask)).collect();
        assert_eq!(shape, vec![(0, 7, 0xf0), (1, 0, 0x3f)]);
        assert_eq!(pieces[1].1.bytes[..6], [5, 6, 7, 8, 9, 10]);
        assert!(pieces.iter().all(|(_, p)| p.seq == 3));
        assert_eq!(split(16, &[0; 8], 0).len(), 1, "an aligned word is one piece");
        assert_eq!(split(4, &[0; 16], 0).len(), 3);
        assert!(split(4, &[], 0).is_empty());
    }

    #[test]
    fn fence_masks_older_pending_bytes_under_newer_durable_ones() {
        let mut line = LineState::default();
        let mut durable = [0u8; 64];
        let (_, older) = split(0, &[1; 8], 1)[0];
        let (_, newer_nt) = split(4, &[2; 4], 2)[0];
        line.cached.push(older);
        line.nt.push(newer_nt);
        line.fence(&mut durable);
        assert_eq!(durable[..8], [0, 0, 0, 0, 2, 2, 2, 2]);
        assert_eq!(line.cached.len(), 1);
        assert_eq!(line.cached[0].mask, 0x0f, "only bytes the NT store did not cover stay");
        assert_eq!(line.compose(&durable, 1, |_| false)[..8], [1, 1, 1, 1, 2, 2, 2, 2]);
        assert_eq!(line.choice_count(), Some(2));
    }
}
