//! `NbdDevice` against a scripted server that breaks the protocol: every hostile reply is a
//! typed error (no panic, no hang, nothing allocated for a length the request did not ask for),
//! and a reply that breaks transmission closes the connection and fails the device.

use std::io::{Read, Write as _};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tally_media::nbd::NbdError;
use tally_media::{Device, IoBuf, MediaError, NbdDevice, NbdOptions, Write, WriteFlags};

const EXPORT_SIZE: u64 = 1 << 20;
const FLAGS: u16 = 1 | 4 | 8; // HAS_FLAGS, SEND_FLUSH, SEND_FUA

/// How the scripted server negotiates.
#[derive(Clone, Copy, PartialEq)]
enum Negotiate {
    /// Structured replies and NBD_OPT_GO.
    Modern,
    /// No structured replies; GO answered NBD_REP_ERR_UNSUP, so EXPORT_NAME.
    Old,
    /// The first option reply claims a 4 GiB payload.
    HugeOptionReply,
    /// Not an NBD server at all.
    BadMagic,
}

struct Request {
    kind: u16,
    cookie: u64,
    offset: u64,
    length: u32,
}

fn read_request(s: &mut UnixStream) -> Request {
    let mut h = [0u8; 28];
    s.read_exact(&mut h).unwrap();
    assert_eq!(u32::from_be_bytes(h[0..4].try_into().unwrap()), 0x2560_9513);
    let r = Request {
        kind: u16::from_be_bytes(h[6..8].try_into().unwrap()),
        cookie: u64::from_be_bytes(h[8..16].try_into().unwrap()),
        offset: u64::from_be_bytes(h[16..24].try_into().unwrap()),
        length: u32::from_be_bytes(h[24..28].try_into().unwrap()),
    };
    if r.kind == 1 {
        let mut data = vec![0u8; r.length as usize];
        s.read_exact(&mut data).unwrap();
    }
    r
}

fn chunk(s: &mut UnixStream, flags: u16, kind: u16, cookie: u64, length: u32, payload: &[u8]) {
    let mut m = Vec::new();
    m.extend_from_slice(&0x668e_33efu32.to_be_bytes());
    m.extend_from_slice(&flags.to_be_bytes());
    m.extend_from_slice(&kind.to_be_bytes());
    m.extend_from_slice(&cookie.to_be_bytes());
    m.extend_from_slice(&length.to_be_bytes());
    m.extend_from_slice(payload);
    // The client may already have hung up on a hostile reply.
    let _ = s.write_all(&m);
}

fn data_chunk(s: &mut UnixStream, done: bool, cookie: u64, offset: u64, data: &[u8]) {
    let mut p = offset.to_be_bytes().to_vec();
    p.extend_from_slice(data);
    chunk(s, u16::from(done), 1, cookie, p.len() as u32, &p);
}

fn simple(s: &mut UnixStream, error: u32, cookie: u64, data: &[u8]) {
    let mut m = Vec::new();
    m.extend_from_slice(&0x6744_6698u32.to_be_bytes());
    m.extend_from_slice(&error.to_be_bytes());
    m.extend_from_slice(&cookie.to_be_bytes());
    m.extend_from_slice(data);
    let _ = s.write_all(&m);
}

fn option_reply(s: &mut UnixStream, option: u32, kind: u32, payload: &[u8]) {
    let mut m = 0x0003_e889_0455_65a9u64.to_be_bytes().to_vec();
    m.extend_from_slice(&option.to_be_bytes());
    m.extend_from_slice(&kind.to_be_bytes());
    m.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    m.extend_from_slice(payload);
    s.write_all(&m).unwrap();
}

/// The server side of negotiation; false if it ended the connection on purpose.
fn negotiate(s: &mut UnixStream, mode: Negotiate) -> bool {
    let magic: &[u8] = if mode == Negotiate::BadMagic { b"HTTP/1.1" } else { b"NBDMAGIC" };
    s.write_all(magic).unwrap();
    s.write_all(b"IHAVEOPT").unwrap();
    s.write_all(&3u16.to_be_bytes()).unwrap(); // FIXED_NEWSTYLE | NO_ZEROES
    let mut client_flags = [0u8; 4];
    if s.read_exact(&mut client_flags).is_err() {
        return false;
    }
    loop {
        let mut h = [0u8; 16];
        if s.read_exact(&mut h).is_err() {
            return false;
        }
        let option = u32::from_be_bytes(h[8..12].try_into().unwrap());
        let mut data = vec![0u8; u32::from_be_bytes(h[12..16].try_into().unwrap()) as usize];
        s.read_exact(&mut data).unwrap();
        match (option, mode) {
            (8, Negotiate::HugeOptionReply) => {
                let mut m = 0x0003_e889_0455_65a9u64.to_be_bytes().to_vec();
                m.extend_from_slice(&8u32.to_be_bytes());
                m.extend_from_slice(&1u32.to_be_bytes());
                m.extend_from_slice(&u32::MAX.to_be_bytes());
                s.write_all(&m).unwrap();
                return false;
            }
            (8, Negotiate::Modern) => option_reply(s, 8, 1, &[]),
            (8, _) => option_reply(s, 8, (1 << 31) + 1, &[]),
            (7, Negotiate::Modern) => {
                let mut info = 0u16.to_be_bytes().to_vec();
                info.extend_from_slice(&EXPORT_SIZE.to_be_bytes());
                info.extend_from_slice(&FLAGS.to_be_bytes());
                option_reply(s, 7, 3, &info);
                option_reply(s, 7, 1, &[]);
                return true;
            }
            (7, _) => option_reply(s, 7, (1 << 31) + 1, &[]),
            (1, _) => {
                s.write_all(&EXPORT_SIZE.to_be_bytes()).unwrap();
                s.write_all(&FLAGS.to_be_bytes()).unwrap();
                return true;
            }
            _ => option_reply(s, option, (1 << 31) + 1, &[]),
        }
    }
}

/// A scripted server on a fresh Unix socket; `script` runs after negotiation.
struct Scripted {
    uri: String,
    path: PathBuf,
    thread: Option<JoinHandle<()>>,
}

impl Scripted {
    fn start(mode: Negotiate, script: impl FnOnce(&mut UnixStream) + Send + 'static) -> Scripted {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("tally-nbd-hostile-{}-{n}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let thread = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            if negotiate(&mut s, mode) {
                script(&mut s);
            }
            // Hold the connection open briefly so the client sees the reply, not an EOF.
            std::thread::sleep(Duration::from_millis(200));
        });
        let uri = format!("nbd+unix:///?socket={}", path.display());
        Scripted { uri, path, thread: Some(thread) }
    }

    fn open(&self) -> Result<NbdDevice, MediaError> {
        let options = NbdOptions { timeout: Duration::from_secs(2), ..NbdOptions::default() };
        NbdDevice::open_uri(&self.uri, options)
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn nbd_error(result: Result<impl std::fmt::Debug, MediaError>) -> NbdError {
    match result {
        Err(MediaError::Nbd { source, .. }) => *source,
        other => panic!("expected an NBD error, got {other:?}"),
    }
}

/// Run `script` against one read of the first block; the read's outcome and the device.
fn read_against(
    mode: Negotiate,
    script: impl FnOnce(&mut UnixStream) + Send + 'static,
) -> (Result<Vec<u8>, MediaError>, NbdDevice, Scripted) {
    let server = Scripted::start(mode, script);
    let dev = server.open().unwrap();
    let mut buf = vec![0u8; 4096];
    let start = Instant::now();
    let result = dev.read(0, &mut buf).map(|()| buf);
    assert!(start.elapsed() < Duration::from_secs(5), "took {:?}", start.elapsed());
    (result, dev, server)
}

fn assert_protocol(result: Result<Vec<u8>, MediaError>, dev: &NbdDevice, what: &str) {
    let error = nbd_error(result);
    assert!(matches!(error, NbdError::Protocol { .. }), "{what}: {error}");
    // The connection is closed: the device is failed, later calls are refused at once.
    let refused = dev.submit(vec![Write::new(1, IoBuf::zeroed(4096))], WriteFlags::NONE);
    assert!(matches!(refused, Err(MediaError::Failed { .. })), "{what}: {refused:?}");
}

/// What a scripted server does after negotiation.
type Script = Box<dyn FnOnce(&mut UnixStream) + Send>;

#[test]
fn replies_that_break_the_protocol_are_typed_errors() {
    let cases: Vec<(&str, Script)> = vec![
        (
            "unknown cookie",
            Box::new(|s| {
                let r = read_request(s);
                data_chunk(s, true, r.cookie + 1000, r.offset, &vec![1; 4096]);
            }),
        ),
        (
            "bad magic",
            Box::new(|s| {
                read_request(s);
                let _ = s.write_all(&[0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0]);
            }),
        ),
        (
            "data longer than the request",
            Box::new(|s| {
                let r = read_request(s);
                data_chunk(s, true, r.cookie, r.offset, &vec![1; 8192]);
            }),
        ),
        (
            "data outside the request",
            Box::new(|s| {
                let r = read_request(s);
                data_chunk(s, true, r.cookie, r.offset + 2048, &vec![1; 4096]);
            }),
        ),
        (
            "a gap",
            Box::new(|s| {
                let r = read_request(s);
                data_chunk(s, false, r.cookie, r.offset, &vec![1; 2048]);
                chunk(s, 1, 0, r.cookie, 0, &[]);
            }),
        ),
        (
            "overlapping chunks",
            Box::new(|s| {
                let r = read_request(s);
                data_chunk(s, false, r.cookie, r.offset, &vec![1; 4096]);
                data_chunk(s, true, r.cookie, r.offset + 1024, &vec![1; 1024]);
            }),
        ),
        (
            "a chunk type not asked for",
            Box::new(|s| {
                let r = read_request(s);
                chunk(s, 1, 5, r.cookie, 12, &[0; 12]);
            }),
        ),
        (
            "a simple reply to a structured read",
            Box::new(|s| {
                let r = read_request(s);
                simple(s, 0, r.cookie, &vec![1; 4096]);
            }),
        ),
        (
            "an error chunk of 4 GiB",
            Box::new(|s| {
                let r = read_request(s);
                chunk(s, 1, 0x8001, r.cookie, u32::MAX, &[0, 0, 0, 5]);
            }),
        ),
        (
            "an error chunk with error 0",
            Box::new(|s| {
                let r = read_request(s);
                chunk(s, 1, 0x8001, r.cookie, 6, &[0, 0, 0, 0, 0, 0]);
            }),
        ),
        (
            "a message longer than its chunk",
            Box::new(|s| {
                let r = read_request(s);
                chunk(s, 1, 0x8001, r.cookie, 8, &[0, 0, 0, 5, 0, 200, b'h', b'i']);
            }),
        ),
        (
            "NONE without DONE",
            Box::new(|s| {
                let r = read_request(s);
                chunk(s, 0, 0, r.cookie, 0, &[]);
            }),
        ),
    ];
    for (what, script) in cases {
        let (result, dev, _server) = read_against(Negotiate::Modern, script);
        assert_protocol(result, &dev, what);
    }
}

#[test]
fn out_of_order_chunks_holes_and_error_messages_are_understood() {
    // Second half first, then a hole for the first half: the read is whole.
    let (result, dev, _server) = read_against(Negotiate::Modern, |s| {
        let r = read_request(s);
        data_chunk(s, false, r.cookie, r.offset + 2048, &vec![7; 2048]);
        let mut hole = r.offset.to_be_bytes().to_vec();
        hole.extend_from_slice(&2048u32.to_be_bytes());
        chunk(s, 1, 2, r.cookie, 12, &hole);
        // An error chunk with a message, for the next read; the connection stays usable.
        let r = read_request(s);
        let mut e = 28u32.to_be_bytes().to_vec();
        e.extend_from_slice(&5u16.to_be_bytes());
        e.extend_from_slice(b"full!");
        chunk(s, 1, 0x8001, r.cookie, e.len() as u32, &e);
        let r = read_request(s);
        data_chunk(s, true, r.cookie, r.offset, &vec![9; 4096]);
    });
    let data = result.unwrap();
    assert!(data[..2048].iter().all(|&b| b == 0) && data[2048..].iter().all(|&b| b == 7));
    let mut buf = vec![0u8; 4096];
    let error = nbd_error(dev.read(0, &mut buf));
    assert_eq!(error, NbdError::Server { errno: 28, name: "NBD_ENOSPC", message: "full!".into() });
    dev.read(0, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 9));
}

#[test]
fn old_servers_get_export_name_and_simple_replies() {
    let (result, dev, _server) = read_against(Negotiate::Old, |s| {
        let r = read_request(s);
        simple(s, 0, r.cookie, &vec![3; r.length as usize]);
        let w = read_request(s);
        assert_eq!(w.kind, 1);
        simple(s, 5, w.cookie, &[]);
    });
    assert!(result.unwrap().iter().all(|&b| b == 3));
    let export = dev.export();
    assert!(!export.structured_replies && !export.negotiated_with_go, "{export:?}");
    let ticket = dev.submit(vec![Write::new(1, IoBuf::zeroed(4096))], WriteFlags::NONE).unwrap();
    let error = nbd_error(dev.wait(ticket));
    assert!(matches!(error, NbdError::Server { errno: 5, .. }), "{error}");
}

#[test]
fn hostile_handshakes_are_refused_without_allocating() {
    let server = Scripted::start(Negotiate::BadMagic, |_| {});
    let error = nbd_error(server.open());
    assert!(matches!(error, NbdError::Handshake { .. }), "{error}");
    let server = Scripted::start(Negotiate::HugeOptionReply, |_| {});
    let error = nbd_error(server.open());
    assert!(
        matches!(&error, NbdError::Handshake { reason, .. } if reason.contains("4294967295")),
        "{error}"
    );
}

#[test]
fn a_server_that_never_answers_times_out() {
    let (result, dev, _server) = read_against(Negotiate::Modern, |s| {
        read_request(s);
        std::thread::sleep(Duration::from_secs(3));
    });
    assert!(matches!(nbd_error(result), NbdError::Timeout { .. }));
    assert!(matches!(dev.flush(), Err(MediaError::Failed { .. })));
}
