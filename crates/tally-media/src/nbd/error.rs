//! What can go wrong with an NBD connection, typed so callers and tests can tell a server's
//! error reply from a dropped connection, a timeout or a reply that breaks the protocol.
//!
//! `Clone` because one failure is reported to every request it ends and to every later wait on
//! the same ticket.

use std::io;
use std::time::Duration;

/// Why an NBD operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NbdError {
    /// An `nbd://` or `nbd+unix://` URI that cannot be used.
    #[error("bad NBD URI {uri:?}: {reason}")]
    BadUri {
        /// The URI given.
        uri: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The server could not be reached.
    #[error("cannot connect to {target}: {reason}")]
    Connect {
        /// The server, as a URI.
        target: String,
        /// The operating system's error, as text.
        reason: String,
    },
    /// The server broke the handshake's rules (wrong magic, a reply to another option, an
    /// impossible size, ...), or speaks a version of it Tally does not.
    #[error("NBD handshake with {target}: {reason}")]
    Handshake {
        /// The server, as a URI.
        target: String,
        /// What it did.
        reason: String,
    },
    /// The server refused the export (unknown name, TLS required, shutting down, ...).
    #[error("{target} refused export {export:?}: {reply} {message:?}")]
    Refused {
        /// The server, as a URI.
        target: String,
        /// The export asked for.
        export: String,
        /// The server's error reply, by name (`NBD_REP_ERR_UNKNOWN`, ...).
        reply: String,
        /// The server's message, if it sent one.
        message: String,
    },
    /// The server answered a request with an error.
    #[error("server error {name} ({errno}){}", if message.is_empty() { String::new() } else { format!(": {message}") })]
    Server {
        /// The NBD error number (`NBD_EIO` = 5, ...).
        errno: u32,
        /// Its name.
        name: &'static str,
        /// The server's message, if it sent one (structured replies only).
        message: String,
    },
    /// A reply that breaks the transmission protocol: unknown magic, a cookie not in flight,
    /// a length that does not match the request, a chunk type the request cannot have. The
    /// connection is closed (a hard disconnect, as the protocol asks).
    #[error("protocol violation by the server: {reason}")]
    Protocol {
        /// What the server sent.
        reason: String,
    },
    /// The connection closed or broke.
    #[error("connection lost: {reason}")]
    Disconnected {
        /// Why, as the operating system or the peer told it.
        reason: String,
    },
    /// A request got no complete reply within the timeout; the connection is closed.
    #[error("no reply within {} ms (server stalled or unreachable)", waited.as_millis())]
    Timeout {
        /// How long the oldest request waited.
        waited: Duration,
    },
    /// The export is read-only and a write was asked for.
    #[error("the export is read-only")]
    ReadOnly,
}

impl NbdError {
    /// The kind of I/O error this corresponds to.
    #[must_use]
    pub fn io_kind(&self) -> io::ErrorKind {
        match self {
            NbdError::BadUri { .. } => io::ErrorKind::InvalidInput,
            NbdError::Connect { .. } => io::ErrorKind::ConnectionRefused,
            NbdError::Handshake { .. } | NbdError::Protocol { .. } => io::ErrorKind::InvalidData,
            NbdError::Refused { .. } => io::ErrorKind::NotFound,
            NbdError::Server { .. } => io::ErrorKind::Other,
            NbdError::Disconnected { .. } => io::ErrorKind::ConnectionAborted,
            NbdError::Timeout { .. } => io::ErrorKind::TimedOut,
            NbdError::ReadOnly => io::ErrorKind::PermissionDenied,
        }
    }

    /// An error reply with NBD error number `errno`.
    pub(crate) fn server(errno: u32, message: String) -> Self {
        NbdError::Server { errno, name: errno_name(errno), message }
    }

    /// A protocol violation.
    pub(crate) fn protocol(reason: impl Into<String>) -> Self {
        NbdError::Protocol { reason: reason.into() }
    }

    /// The connection broke with `error`; a read timeout counts as no reply.
    pub(crate) fn from_io(error: &io::Error, waited: Duration) -> Self {
        match error.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => NbdError::Timeout { waited },
            io::ErrorKind::UnexpectedEof => {
                NbdError::Disconnected { reason: "the server closed the connection".to_string() }
            }
            _ => NbdError::Disconnected { reason: error.to_string() },
        }
    }
}

/// The name of an NBD error number.
#[must_use]
pub fn errno_name(errno: u32) -> &'static str {
    match errno {
        1 => "NBD_EPERM",
        5 => "NBD_EIO",
        12 => "NBD_ENOMEM",
        22 => "NBD_EINVAL",
        28 => "NBD_ENOSPC",
        75 => "NBD_EOVERFLOW",
        95 => "NBD_ENOTSUP",
        108 => "NBD_ESHUTDOWN",
        _ => "unknown NBD error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_cause() {
        let e = NbdError::server(5, "injected".to_string());
        assert_eq!(e.to_string(), "server error NBD_EIO (5): injected");
        assert_eq!(
            NbdError::server(99, String::new()).to_string(),
            "server error unknown NBD error (99)"
        );
        let eof = io::Error::from(io::ErrorKind::UnexpectedEof);
        assert!(matches!(NbdError::from_io(&eof, Duration::ZERO), NbdError::Disconnected { .. }));
        let slow = io::Error::from(io::ErrorKind::WouldBlock);
        let t = NbdError::from_io(&slow, Duration::from_millis(1500));
        assert_eq!(t.to_string(), "no reply within 1500 ms (server stalled or unreachable)");
        assert_eq!(t.io_kind(), io::ErrorKind::TimedOut);
    }
}
