//! Fixed newstyle negotiation, client side.
//!
//! Order: greeting → client flags → `NBD_OPT_STRUCTURED_REPLY` (kept if acknowledged) →
//! `NBD_OPT_GO` asking for `NBD_INFO_EXPORT` and `NBD_INFO_BLOCK_SIZE` → transmission. Only a
//! server that answers GO with `NBD_REP_ERR_UNSUP` (or is not fixed newstyle at all) gets
//! `NBD_OPT_EXPORT_NAME` instead, as the protocol asks.
//!
//! Every length the server sends is checked before anything is allocated for it; every reply
//! must be to the option just sent; the socket's timeouts (set by the caller) bound each read.

use std::io::{Read, Write};
use std::time::Duration;

use super::target::Stream;
use super::wire::{
    be16, be32, be64, encode_option, reply_name, OptionReply, CLIENT_FIXED_NEWSTYLE,
    CLIENT_NO_ZEROES, FLAG_FIXED_NEWSTYLE, FLAG_NO_ZEROES, INFO_BLOCK_SIZE, INFO_EXPORT,
    INIT_MAGIC, OLDSTYLE_MAGIC, OPTION_MAGIC, OPTION_REPLY_MAGIC, OPTION_REPLY_PAYLOAD_MAX,
    OPTION_REPLY_SIZE, OPT_ABORT, OPT_EXPORT_NAME, OPT_GO, OPT_STRUCTURED_REPLY, REP_ACK,
    REP_ERR_UNSUP, REP_FLAG_ERROR, REP_INFO, TFLAG_HAS_FLAGS,
};
use super::{NbdError, NbdTarget};

/// Block size constraints a server advertised (`NBD_INFO_BLOCK_SIZE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct BlockSizes {
    /// Smallest addressable length and alignment.
    pub minimum: u32,
    /// Size below which I/O is inefficient (read-modify-write).
    pub preferred: u32,
    /// Largest request payload the server accepts.
    pub maximum: u32,
}

/// What negotiation settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ExportInfo {
    /// Size of the export in bytes.
    pub size_bytes: u64,
    /// Transmission flags.
    pub flags: u16,
    /// Block size constraints, if the server gave them.
    pub block_sizes: Option<BlockSizes>,
    /// Whether structured replies were negotiated.
    pub structured_replies: bool,
    /// Whether transmission was entered with `NBD_OPT_GO` (else `NBD_OPT_EXPORT_NAME`).
    pub negotiated_with_go: bool,
}

impl ExportInfo {
    /// Whether the server takes `NBD_CMD_FLAG_FUA` on writes.
    #[must_use]
    pub fn has_fua(&self) -> bool {
        self.flags & super::wire::TFLAG_SEND_FUA != 0
    }

    /// Whether the server declares a volatile cache (`NBD_FLAG_SEND_FLUSH`).
    #[must_use]
    pub fn has_flush(&self) -> bool {
        self.flags & super::wire::TFLAG_SEND_FLUSH != 0
    }

    /// Whether the server allows several connections to the export (`NBD_FLAG_CAN_MULTI_CONN`).
    #[must_use]
    pub fn has_multi_conn(&self) -> bool {
        self.flags & super::wire::TFLAG_CAN_MULTI_CONN != 0
    }
}

struct Negotiation<'a> {
    stream: &'a mut Stream,
    target: &'a NbdTarget,
    timeout: Duration,
}

/// Negotiate `target`'s export on `stream`, ending in the transmission phase.
pub(crate) fn negotiate(
    stream: &mut Stream,
    target: &NbdTarget,
    timeout: Duration,
) -> Result<ExportInfo, NbdError> {
    let mut n = Negotiation { stream, target, timeout };
    n.run()
}

impl Negotiation<'_> {
    fn fail(&self, reason: impl Into<String>) -> NbdError {
        NbdError::Handshake { target: self.target.to_string(), reason: reason.into() }
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<(), NbdError> {
        self.stream.read_exact(buf).map_err(|e| match NbdError::from_io(&e, self.timeout) {
            NbdError::Disconnected { reason } => self.fail(format!("{reason} during negotiation")),
            other => other,
        })
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), NbdError> {
        self.stream.write_all(bytes).map_err(|e| NbdError::from_io(&e, self.timeout))
    }

    fn run(&mut self) -> Result<ExportInfo, NbdError> {
        let mut greeting = [0u8; 18];
        self.read(&mut greeting[..16])?;
        if be64(&greeting[0..8]) != INIT_MAGIC {
            return Err(self.fail("not an NBD server (no NBDMAGIC)"));
        }
        match be64(&greeting[8..16]) {
            OPTION_MAGIC => {}
            OLDSTYLE_MAGIC => return Err(self.fail("oldstyle negotiation is not supported")),
            other => return Err(self.fail(format!("unknown negotiation magic {other:#x}"))),
        }
        self.read(&mut greeting[16..18])?;
        let server_flags = be16(&greeting[16..18]);
        let fixed = server_flags & FLAG_FIXED_NEWSTYLE != 0;
        let no_zeroes = server_flags & FLAG_NO_ZEROES != 0;
        let mut client_flags = 0u32;
        if fixed {
            client_flags |= CLIENT_FIXED_NEWSTYLE;
        }
        if no_zeroes {
            client_flags |= CLIENT_NO_ZEROES;
        }
        self.send(&client_flags.to_be_bytes())?;
        if !fixed {
            // Plain newstyle allows one option, EXPORT_NAME, and no replies to anything else.
            return self.export_name(no_zeroes, false);
        }
        let structured = self.structured_reply()?;
        match self.go(structured)? {
            Some(info) => Ok(info),
            None => self.export_name(no_zeroes, structured),
        }
    }

    /// Read one option reply to `option`; its payload, bounded.
    fn reply(&mut self, option: u32) -> Result<(OptionReply, Vec<u8>), NbdError> {
        let mut header = [0u8; OPTION_REPLY_SIZE];
        self.read(&mut header)?;
        let reply = OptionReply::decode(&header);
        if reply.magic != OPTION_REPLY_MAGIC {
            return Err(self.fail(format!("option reply magic {:#x}", reply.magic)));
        }
        if reply.option != option {
            return Err(
                self.fail(format!("reply to option {} while {option} was asked", reply.option))
            );
        }
        if reply.length > OPTION_REPLY_PAYLOAD_MAX {
            return Err(self.fail(format!("option reply of {} bytes", reply.length)));
        }
        let mut payload = vec![0u8; reply.length as usize];
        self.read(&mut payload)?;
        Ok((reply, payload))
    }

    fn structured_reply(&mut self) -> Result<bool, NbdError> {
        self.send(&encode_option(OPT_STRUCTURED_REPLY, &[]))?;
        let (reply, _) = self.reply(OPT_STRUCTURED_REPLY)?;
        match reply.kind {
            REP_ACK => Ok(true),
            kind if kind & REP_FLAG_ERROR != 0 => {
                tracing::debug!(reply = %reply_name(kind), "server declined structured replies");
                Ok(false)
            }
            kind => Err(self.fail(format!("{} to NBD_OPT_STRUCTURED_REPLY", reply_name(kind)))),
        }
    }

    /// `NBD_OPT_GO`; `None` if the server does not know it.
    fn go(&mut self, structured: bool) -> Result<Option<ExportInfo>, NbdError> {
        let name = self.target.export.as_bytes();
        let name_len =
            u32::try_from(name.len()).map_err(|_| self.fail("export name longer than 4 GiB"))?;
        let mut data = Vec::with_capacity(name.len() + 10);
        data.extend_from_slice(&name_len.to_be_bytes());
        data.extend_from_slice(name);
        data.extend_from_slice(&2u16.to_be_bytes());
        data.extend_from_slice(&INFO_EXPORT.to_be_bytes());
        data.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        self.send(&encode_option(OPT_GO, &data))?;
        let mut export = None;
        let mut block_sizes = None;
        // Each reply is read in full before the next; a server may send informational replies
        // without end, so bound their number.
        for _ in 0..1024 {
            let (reply, payload) = self.reply(OPT_GO)?;
            match reply.kind {
                REP_INFO => {
                    if payload.len() < 2 {
                        return Err(self.fail("NBD_REP_INFO without a type"));
                    }
                    match be16(&payload[0..2]) {
                        INFO_EXPORT if payload.len() == 12 => {
                            export = Some((be64(&payload[2..10]), be16(&payload[10..12])));
                        }
                        INFO_BLOCK_SIZE if payload.len() == 14 => {
                            block_sizes = Some(self.block_sizes(&payload[2..])?);
                        }
                        INFO_EXPORT | INFO_BLOCK_SIZE => {
                            return Err(
                                self.fail(format!("NBD_REP_INFO of {} bytes", payload.len()))
                            );
                        }
                        _ => {} // Information not asked for: ignored, as the protocol says.
                    }
                }
                REP_ACK => {
                    let Some((size_bytes, flags)) = export else {
                        return Err(self.fail("NBD_OPT_GO acknowledged without NBD_INFO_EXPORT"));
                    };
                    return self
                        .checked(size_bytes, flags, block_sizes, structured, true)
                        .map(Some);
                }
                REP_ERR_UNSUP => return Ok(None),
                kind if kind & REP_FLAG_ERROR != 0 => {
                    // Soft disconnect before reporting, as the protocol asks after an error.
                    let _ = self.send(&encode_option(OPT_ABORT, &[]));
                    return Err(NbdError::Refused {
                        target: self.target.to_string(),
                        export: self.target.export.clone(),
                        reply: reply_name(kind),
                        message: String::from_utf8_lossy(&payload).into_owned(),
                    });
                }
                kind => return Err(self.fail(format!("{} to NBD_OPT_GO", reply_name(kind)))),
            }
        }
        Err(self.fail("more than 1024 replies to NBD_OPT_GO"))
    }

    fn block_sizes(&self, p: &[u8]) -> Result<BlockSizes, NbdError> {
        let sizes = BlockSizes {
            minimum: be32(&p[0..4]),
            preferred: be32(&p[4..8]),
            maximum: be32(&p[8..12]),
        };
        let BlockSizes { minimum, preferred, maximum } = sizes;
        let ok = minimum.is_power_of_two()
            && minimum <= 65536
            && preferred.is_power_of_two()
            && preferred >= minimum.max(512)
            && maximum >= preferred;
        if !ok {
            return Err(self.fail(format!("impossible block sizes {sizes:?}")));
        }
        Ok(sizes)
    }

    fn export_name(&mut self, no_zeroes: bool, structured: bool) -> Result<ExportInfo, NbdError> {
        self.send(&encode_option(OPT_EXPORT_NAME, self.target.export.as_bytes()))?;
        let mut reply = [0u8; 10 + 124];
        let len = if no_zeroes { 10 } else { reply.len() };
        // A server that refuses the export can only close the connection.
        self.read(&mut reply[..len]).map_err(|e| match e {
            NbdError::Handshake { reason, .. } => NbdError::Refused {
                target: self.target.to_string(),
                export: self.target.export.clone(),
                reply: "closed after NBD_OPT_EXPORT_NAME".to_string(),
                message: reason,
            },
            other => other,
        })?;
        self.checked(be64(&reply[0..8]), be16(&reply[8..10]), None, structured, false)
    }

    fn checked(
        &self,
        size_bytes: u64,
        flags: u16,
        block_sizes: Option<BlockSizes>,
        structured_replies: bool,
        negotiated_with_go: bool,
    ) -> Result<ExportInfo, NbdError> {
        if flags & TFLAG_HAS_FLAGS == 0 {
            return Err(self.fail(format!("transmission flags {flags:#x} lack NBD_FLAG_HAS_FLAGS")));
        }
        Ok(ExportInfo { size_bytes, flags, block_sizes, structured_replies, negotiated_with_go })
    }
}
