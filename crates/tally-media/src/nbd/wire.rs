//! The NBD protocol's numbers and fixed-size messages, as the protocol document
//! (`doc/proto.md` of the NBD project) defines them. Everything is big-endian on the wire.
//!
//! Only the subset Tally uses: fixed newstyle negotiation, `NBD_OPT_GO` /
//! `NBD_OPT_EXPORT_NAME` / `NBD_OPT_STRUCTURED_REPLY`, and the commands READ, WRITE, FLUSH,
//! TRIM and DISC. No TLS, no extended headers, no block status.

/// `NBDMAGIC`, the server's first eight bytes.
pub(crate) const INIT_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: newstyle negotiation, and the magic of every option the client sends.
pub(crate) const OPTION_MAGIC: u64 = 0x4948_4156_454f_5054;
/// The second magic of an oldstyle server, which Tally does not support.
pub(crate) const OLDSTYLE_MAGIC: u64 = 0x0000_4202_8186_1253;
/// Magic of the server's option replies.
pub(crate) const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a transmission request.
pub(crate) const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub(crate) const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub(crate) const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flag: the server speaks fixed newstyle.
pub(crate) const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag: the server can omit the 124 zero bytes after `NBD_OPT_EXPORT_NAME`.
pub(crate) const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flag: fixed newstyle.
pub(crate) const CLIENT_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: no zero padding.
pub(crate) const CLIENT_NO_ZEROES: u32 = 1 << 1;

/// Option: choose the export and enter transmission (no error reply possible).
pub(crate) const OPT_EXPORT_NAME: u32 = 1;
/// Option: end negotiation (soft disconnect).
pub(crate) const OPT_ABORT: u32 = 2;
/// Option: choose the export, with information and error replies, and enter transmission.
pub(crate) const OPT_GO: u32 = 7;
/// Option: structured replies.
pub(crate) const OPT_STRUCTURED_REPLY: u32 = 8;

/// Option reply: success, final.
pub(crate) const REP_ACK: u32 = 1;
/// Option reply: one piece of information about the export.
pub(crate) const REP_INFO: u32 = 3;
/// Bit set in every error option reply.
pub(crate) const REP_FLAG_ERROR: u32 = 1 << 31;
/// Option reply error: the option is not supported.
pub(crate) const REP_ERR_UNSUP: u32 = REP_FLAG_ERROR | 1;

/// Information type: size and transmission flags.
pub(crate) const INFO_EXPORT: u16 = 0;
/// Information type: block size constraints.
pub(crate) const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flag: always set.
pub(crate) const TFLAG_HAS_FLAGS: u16 = 1 << 0;
/// Transmission flag: the export is read-only.
pub(crate) const TFLAG_READ_ONLY: u16 = 1 << 1;
/// Transmission flag: `NBD_CMD_FLUSH` is supported.
pub(crate) const TFLAG_SEND_FLUSH: u16 = 1 << 2;
/// Transmission flag: `NBD_CMD_FLAG_FUA` is supported.
pub(crate) const TFLAG_SEND_FUA: u16 = 1 << 3;
/// Transmission flag: `NBD_CMD_TRIM` is supported.
pub(crate) const TFLAG_SEND_TRIM: u16 = 1 << 5;
/// Transmission flag: flush and FUA act across every connection to the export.
pub(crate) const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;

/// Command flag: force unit access.
pub(crate) const CMD_FLAG_FUA: u16 = 1 << 0;

/// Structured reply flag: the last chunk of a reply.
pub(crate) const REPLY_FLAG_DONE: u16 = 1 << 0;
/// Chunk type: nothing (final, success unless an error chunk came before).
pub(crate) const REPLY_TYPE_NONE: u16 = 0;
/// Chunk type: data at an offset.
pub(crate) const REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// Chunk type: a hole (reads as zeroes) at an offset.
pub(crate) const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
/// Bit set in every error chunk type.
pub(crate) const REPLY_TYPE_FLAG_ERROR: u16 = 1 << 15;
/// Chunk type: an error.
pub(crate) const REPLY_TYPE_ERROR: u16 = REPLY_TYPE_FLAG_ERROR | 1;
/// Chunk type: an error at an offset.
pub(crate) const REPLY_TYPE_ERROR_OFFSET: u16 = REPLY_TYPE_FLAG_ERROR | 2;

/// Longest error message a server may send in a chunk.
pub(crate) const ERROR_MESSAGE_MAX: u32 = 4096;
/// Longest option reply payload Tally reads (informational replies are a few bytes; error
/// strings are bounded by the protocol to 4096).
pub(crate) const OPTION_REPLY_PAYLOAD_MAX: u32 = 64 * 1024;
/// Largest request payload Tally sends or reads, whatever the server advertises: the
/// protocol's interoperable maximum (2^25).
pub(crate) const PAYLOAD_MAX: u32 = 1 << 25;

/// Size of a request header.
pub(crate) const REQUEST_SIZE: usize = 28;
/// Size of a simple reply (after its 4-byte magic: error, cookie).
pub(crate) const SIMPLE_REPLY_REST: usize = 12;
/// Size of a structured reply chunk header (after its 4-byte magic).
pub(crate) const STRUCTURED_REPLY_REST: usize = 16;
/// Size of an option reply header.
pub(crate) const OPTION_REPLY_SIZE: usize = 20;

/// A transmission command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Command {
    /// `NBD_CMD_READ`.
    Read,
    /// `NBD_CMD_WRITE`.
    Write,
    /// `NBD_CMD_DISC`.
    Disconnect,
    /// `NBD_CMD_FLUSH`.
    Flush,
    /// `NBD_CMD_TRIM`.
    Trim,
}

impl Command {
    /// The command's number.
    pub(crate) fn code(self) -> u16 {
        match self {
            Command::Read => 0,
            Command::Write => 1,
            Command::Disconnect => 2,
            Command::Flush => 3,
            Command::Trim => 4,
        }
    }

    /// The operation's name in errors.
    pub(crate) fn op(self) -> &'static str {
        match self {
            Command::Read => "nbd read",
            Command::Write => "nbd write",
            Command::Disconnect => "nbd disconnect",
            Command::Flush => "nbd flush",
            Command::Trim => "nbd trim",
        }
    }
}

/// A request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) flags: u16,
    pub(crate) command: Command,
    pub(crate) cookie: u64,
    pub(crate) offset: u64,
    pub(crate) length: u32,
}

impl Request {
    /// The 28 bytes on the wire.
    pub(crate) fn encode(&self) -> [u8; REQUEST_SIZE] {
        let mut out = [0u8; REQUEST_SIZE];
        out[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.command.code().to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        out[16..24].copy_from_slice(&self.offset.to_be_bytes());
        out[24..28].copy_from_slice(&self.length.to_be_bytes());
        out
    }
}

/// The header of a structured reply chunk (after the magic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkHeader {
    pub(crate) flags: u16,
    pub(crate) kind: u16,
    pub(crate) cookie: u64,
    pub(crate) length: u32,
}

impl ChunkHeader {
    /// Decode the 16 bytes after the magic.
    pub(crate) fn decode(rest: &[u8; STRUCTURED_REPLY_REST]) -> Self {
        ChunkHeader {
            flags: be16(&rest[0..2]),
            kind: be16(&rest[2..4]),
            cookie: be64(&rest[4..12]),
            length: be32(&rest[12..16]),
        }
    }
}

/// The header of an option reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OptionReply {
    pub(crate) magic: u64,
    pub(crate) option: u32,
    pub(crate) kind: u32,
    pub(crate) length: u32,
}

impl OptionReply {
    /// Decode the 20 bytes.
    pub(crate) fn decode(bytes: &[u8; OPTION_REPLY_SIZE]) -> Self {
        OptionReply {
            magic: be64(&bytes[0..8]),
            option: be32(&bytes[8..12]),
            kind: be32(&bytes[12..16]),
            length: be32(&bytes[16..20]),
        }
    }
}

/// An option as sent by the client: header and data.
pub(crate) fn encode_option(option: u32, data: &[u8]) -> Vec<u8> {
    let length = u32::try_from(data.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(16 + data.len());
    out.extend_from_slice(&OPTION_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// The name of an option reply type, for messages.
pub(crate) fn reply_name(kind: u32) -> String {
    let name = match kind {
        REP_ACK => "NBD_REP_ACK",
        2 => "NBD_REP_SERVER",
        REP_INFO => "NBD_REP_INFO",
        4 => "NBD_REP_META_CONTEXT",
        REP_ERR_UNSUP => "NBD_REP_ERR_UNSUP",
        0x8000_0002 => "NBD_REP_ERR_POLICY",
        0x8000_0003 => "NBD_REP_ERR_INVALID",
        0x8000_0004 => "NBD_REP_ERR_PLATFORM",
        0x8000_0005 => "NBD_REP_ERR_TLS_REQD",
        0x8000_0006 => "NBD_REP_ERR_UNKNOWN",
        0x8000_0007 => "NBD_REP_ERR_SHUTDOWN",
        0x8000_0008 => "NBD_REP_ERR_BLOCK_SIZE_REQD",
        0x8000_0009 => "NBD_REP_ERR_TOO_BIG",
        _ => return format!("option reply {kind:#x}"),
    };
    name.to_string()
}

/// Big-endian u16 of a 2-byte slice.
pub(crate) fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

/// Big-endian u32 of a 4-byte slice.
pub(crate) fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Big-endian u64 of an 8-byte slice.
pub(crate) fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magics_spell_what_the_protocol_says() {
        assert_eq!(&INIT_MAGIC.to_be_bytes(), b"NBDMAGIC");
        assert_eq!(&OPTION_MAGIC.to_be_bytes(), b"IHAVEOPT");
        assert_eq!(REP_ERR_UNSUP, (1 << 31) + 1);
        assert_eq!(REPLY_TYPE_ERROR, (1 << 15) + 1);
    }

    #[test]
    fn request_layout() {
        let r = Request {
            flags: CMD_FLAG_FUA,
            command: Command::Write,
            cookie: 0x0102_0304_0506_0708,
            offset: 0x1000,
            length: 512,
        };
        let b = r.encode();
        assert_eq!(be32(&b[0..4]), REQUEST_MAGIC);
        assert_eq!((be16(&b[4..6]), be16(&b[6..8])), (1, 1));
        assert_eq!(be64(&b[8..16]), 0x0102_0304_0506_0708);
        assert_eq!((be64(&b[16..24]), be32(&b[24..28])), (0x1000, 512));
    }

    #[test]
    fn reply_headers_decode() {
        let mut rest = [0u8; STRUCTURED_REPLY_REST];
        rest[0..2].copy_from_slice(&REPLY_FLAG_DONE.to_be_bytes());
        rest[2..4].copy_from_slice(&REPLY_TYPE_OFFSET_DATA.to_be_bytes());
        rest[4..12].copy_from_slice(&9u64.to_be_bytes());
        rest[12..16].copy_from_slice(&520u32.to_be_bytes());
        let h = ChunkHeader::decode(&rest);
        assert_eq!((h.flags, h.kind, h.cookie, h.length), (1, 1, 9, 520));
        let opt = encode_option(OPT_GO, b"ab");
        assert_eq!(opt.len(), 18);
        assert_eq!((be32(&opt[8..12]), be32(&opt[12..16])), (OPT_GO, 2));
        assert_eq!(reply_name(0x8000_0006), "NBD_REP_ERR_UNKNOWN");
        assert_eq!(reply_name(77), "option reply 0x4d");
    }
}
