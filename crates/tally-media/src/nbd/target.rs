//! Where an NBD export lives: `nbd://host[:port]/export` or
//! `nbd+unix:///export?socket=PATH`, as the NBD project's URI document (`doc/uri.md`) defines
//! them; and the socket that reaches it.
//!
//! TLS (`nbds`, `nbds+unix`) is refused with a clear error: Tally's client does not speak it.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use super::NbdError;

/// The port IANA assigned to NBD.
pub const NBD_PORT_DEFAULT: u16 = 10809;

/// How to reach a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NbdAddress {
    /// TCP to a host name or address and a port.
    Tcp {
        /// Host name, IPv4 address or IPv6 address (without brackets).
        host: String,
        /// Port.
        port: u16,
    },
    /// A Unix domain socket.
    Unix {
        /// The socket's path.
        path: PathBuf,
    },
}

/// One export on one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdTarget {
    /// The server.
    pub address: NbdAddress,
    /// The export's name; empty for the server's default export.
    pub export: String,
}

impl NbdTarget {
    /// Whether `text` looks like an NBD URI (so a caller can tell it from a path).
    #[must_use]
    pub fn is_uri(text: &str) -> bool {
        ["nbd://", "nbd+unix://", "nbds://", "nbds+unix://"].iter().any(|s| text.starts_with(s))
    }

    /// Parse an `nbd://` or `nbd+unix://` URI.
    ///
    /// # Errors
    /// [`NbdError::BadUri`] for another scheme, TLS schemes, a missing socket parameter, a
    /// bad port or bad percent-encoding.
    pub fn parse(uri: &str) -> Result<Self, NbdError> {
        let bad = |reason: &str| NbdError::BadUri { uri: uri.to_string(), reason: reason.into() };
        let (scheme, rest) = uri.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let rest = rest.split_once('#').map_or(rest, |(r, _)| r);
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let export =
            percent_decode(path).ok_or_else(|| bad("bad percent-encoding in the export"))?;
        let mut socket = None;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if key == "socket" {
                let value =
                    percent_decode(value).ok_or_else(|| bad("bad percent-encoding in socket"))?;
                socket = Some(value);
            }
        }
        let address = match scheme {
            "nbd" => {
                if authority.is_empty() {
                    return Err(bad("nbd:// needs a host"));
                }
                let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
                let (host, port) =
                    split_host_port(hostport).ok_or_else(|| bad("bad host or port"))?;
                NbdAddress::Tcp { host, port }
            }
            "nbd+unix" => {
                let path = socket.ok_or_else(|| bad("nbd+unix:// needs ?socket=PATH"))?;
                if path.is_empty() || path.starts_with('\0') {
                    return Err(bad("empty or abstract socket path"));
                }
                NbdAddress::Unix { path: PathBuf::from(path) }
            }
            "nbds" | "nbds+unix" => return Err(bad("TLS (nbds) is not supported")),
            _ => return Err(bad("the scheme is not nbd or nbd+unix")),
        };
        Ok(NbdTarget { address, export })
    }

    /// Open a socket to the server, within `timeout` for TCP.
    pub(crate) fn connect(&self, timeout: Duration) -> Result<Stream, NbdError> {
        let fail = |error: io::Error| NbdError::Connect {
            target: self.to_string(),
            reason: error.to_string(),
        };
        match &self.address {
            NbdAddress::Tcp { host, port } => {
                let mut last = io::Error::new(io::ErrorKind::NotFound, "no address for the host");
                for addr in (host.as_str(), *port).to_socket_addrs().map_err(fail)? {
                    match TcpStream::connect_timeout(&addr, timeout) {
                        Ok(stream) => {
                            // Requests are small messages sent as one vectored write each;
                            // Nagle would hold them back waiting for replies.
                            stream.set_nodelay(true).map_err(fail)?;
                            return Ok(Stream::Tcp(stream));
                        }
                        Err(error) => last = error,
                    }
                }
                Err(fail(last))
            }
            NbdAddress::Unix { path } => UnixStream::connect(path).map(Stream::Unix).map_err(fail),
        }
    }
}

impl fmt::Display for NbdTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let export = percent_encode(&self.export);
        match &self.address {
            NbdAddress::Tcp { host, port } if host.contains(':') => {
                write!(f, "nbd://[{host}]:{port}/{export}")
            }
            NbdAddress::Tcp { host, port } => write!(f, "nbd://{host}:{port}/{export}"),
            NbdAddress::Unix { path } => {
                let socket = percent_encode(&path.to_string_lossy());
                write!(f, "nbd+unix:///{export}?socket={socket}")
            }
        }
    }
}

fn split_host_port(hostport: &str) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        (host, after.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (hostport, None),
        }
    };
    let port = match port {
        Some(p) => p.parse().ok().filter(|&p| p != 0)?,
        None => NBD_PORT_DEFAULT,
    };
    (!host.is_empty()).then(|| (host.to_string(), port))
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A connected socket, TCP or Unix.
#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    /// A second handle on the same socket (one reads, one writes).
    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        match self {
            Stream::Tcp(s) => s.try_clone().map(Stream::Tcp),
            Stream::Unix(s) => s.try_clone().map(Stream::Unix),
        }
    }

    /// Bound blocking reads; `None` blocks forever.
    pub(crate) fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(timeout),
            Stream::Unix(s) => s.set_read_timeout(timeout),
        }
    }

    /// Bound blocking writes.
    pub(crate) fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(timeout),
            Stream::Unix(s) => s.set_write_timeout(timeout),
        }
    }

    /// Shut the socket down both ways, waking a reader blocked on it.
    pub(crate) fn shutdown(&self) {
        // Fails only if already shut down or never connected; nothing to do about either.
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }

    /// Write every byte of `parts`, in order, in as few system calls as the socket allows.
    /// Returns the number of system calls made.
    pub(crate) fn write_all_parts(&mut self, parts: &[&[u8]]) -> io::Result<u64> {
        let mut calls = 0u64;
        let mut index = 0;
        let mut skip = 0;
        while index < parts.len() {
            let slices: Vec<io::IoSlice<'_>> =
                std::iter::once(io::IoSlice::new(&parts[index][skip..]))
                    .chain(parts[index + 1..].iter().map(|p| io::IoSlice::new(p)))
                    .collect();
            let mut written = match self.write_vectored(&slices) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            calls += 1;
            while index < parts.len() && written >= parts[index].len() - skip {
                written -= parts[index].len() - skip;
                index += 1;
                skip = 0;
            }
            skip += written;
        }
        Ok(calls)
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored(bufs),
            Stream::Unix(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16, export: &str) -> NbdTarget {
        NbdTarget { address: NbdAddress::Tcp { host: host.into(), port }, export: export.into() }
    }

    #[test]
    fn uris_parse_as_the_uri_document_says() {
        assert_eq!(
            NbdTarget::parse("nbd://example.com/disk").unwrap(),
            tcp("example.com", 10809, "disk")
        );
        assert_eq!(NbdTarget::parse("nbd://example.com").unwrap(), tcp("example.com", 10809, ""));
        assert_eq!(NbdTarget::parse("nbd://example.com/").unwrap(), tcp("example.com", 10809, ""));
        assert_eq!(NbdTarget::parse("nbd://h:1234//disk").unwrap(), tcp("h", 1234, "/disk"));
        assert_eq!(
            NbdTarget::parse("nbd://h/hello%20world").unwrap(),
            tcp("h", 10809, "hello world")
        );
        assert_eq!(NbdTarget::parse("nbd://[::1]:99/x").unwrap(), tcp("::1", 99, "x"));
        assert_eq!(NbdTarget::parse("nbd://user@h:7/x").unwrap(), tcp("h", 7, "x"));
        let unix = NbdTarget::parse("nbd+unix:///disk?socket=/tmp/a%20b.sock").unwrap();
        assert_eq!(unix.address, NbdAddress::Unix { path: "/tmp/a b.sock".into() });
        assert_eq!(unix.export, "disk");
        for bad in [
            "nbd+unix:///disk",
            "nbds://h/x",
            "http://h/x",
            "nbd:///x",
            "nbd://h:0/x",
            "nbd://h:99999/x",
            "nbd://h/%zz",
            "nbd+unix:///?socket=%00abstract",
            "plain/path",
        ] {
            assert!(matches!(NbdTarget::parse(bad), Err(NbdError::BadUri { .. })), "{bad}");
        }
        assert!(NbdTarget::is_uri("nbd+unix:///x?socket=s") && !NbdTarget::is_uri("/img"));
    }

    #[test]
    fn display_parses_back() {
        for uri in ["nbd://h:1234/a%20b", "nbd://[::1]:99/x", "nbd+unix:///e?socket=/s/p.sock"] {
            let target = NbdTarget::parse(uri).unwrap();
            assert_eq!(target.to_string(), uri);
            assert_eq!(NbdTarget::parse(&target.to_string()).unwrap(), target);
        }
    }
}
