//! `tally inspect IMAGE [--json]`: what a Tally image holds, read-only.
//!
//! The superblock copies are decoded as they are on the image. The log's recovery then runs on
//! a copy-on-write view (as in `tally fsck`) to tell which transactions of each stream survive,
//! i.e. what is durable; the file system is mounted on a second view to measure how live each
//! segment of each stream's chain is.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use tally_fs::{Fs, MountOptions, MountReport};
use tally_log::format::superblock::Superblock;
use tally_log::{Log, OpenOptions, Recovery};
use tally_media::{Device, OverlayDevice};

use crate::fsck::{classify_mount_error, open_image, CopyReport, EXIT_CORRUPT};

/// Arguments of `tally inspect`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
Examples:
  tally inspect /var/tmp/tally.img          superblock, streams, segments, what is durable
  tally inspect /var/tmp/tally.img --json   the same as one JSON object on stdout

Read-only: the image is opened read-only and recovery runs in memory. An image served by \
`tally mount` is shown with a warning (as last written; the daemon may hold more in memory).

Per stream: the checkpoint (everything up to its sequence number is applied and needs no \
replay), the transactions after it that recovery keeps (durable: they survive a crash now), \
those dropped because a transaction they depend on on another stream did not survive, and the \
stream's chain of segments with how many of their records are still live.

Exit codes: 0 shown; 2 bad arguments; 4 the image is a Tally image but cannot be mounted (what \
could be read is shown); 8 unusable image (not a Tally image, truncated, or unreadable). \
docs/CLI.md describes the JSON fields.")]
pub struct Args {
    /// Image file, block device or NBD export (`nbd://...`, `nbd+unix://...`) made by
    /// `tally mkfs`; for a multi-target image, every target in mkfs's order.
    #[arg(value_name = "IMAGE", required = true, num_args = 1..)]
    images: Vec<PathBuf>,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// The superblock in force (the valid copy with the highest generation).
#[derive(Debug, serde::Serialize)]
struct SuperblockView {
    copy_block: u64,
    generation: u64,
    uuid: String,
    block_size: u32,
    block_count: u64,
    segment_blocks: u32,
    segment_count: u32,
    first_segment_block: u64,
    snapshot_segment: Option<u32>,
    /// The snapshot is a checkpoint snapshot (written online once the replay budget was spent;
    /// a crash recovery starts from it): the superblock generation that first pointed at it.
    checkpoint_snapshot_generation: Option<u64>,
}

/// The checkpoint of one stream, as the superblock records it.
#[derive(Debug, serde::Serialize)]
struct CheckpointView {
    seq: u64,
    epoch: u32,
    segment: u32,
    offset: u32,
    next_segment: u32,
}

/// What recovery keeps of one stream.
#[derive(Debug, serde::Serialize)]
struct RecoveredView {
    transactions: u64,
    first_seq: Option<u64>,
    last_seq: Option<u64>,
    cut_by_dependency: u64,
    epoch_after_recovery: u32,
}

/// One segment of a stream's chain.
#[derive(Debug, serde::Serialize)]
struct SegmentView {
    segment: u32,
    transactions: u64,
    /// Bytes of records and data blocks written in it since the checkpoint.
    bytes: u64,
    /// Of those, bytes still live (what cleaning would move).
    live_bytes: u64,
    /// `live_bytes / bytes`; `null` for a segment with nothing in it yet.
    live_ratio: Option<f64>,
}

/// One stream.
#[derive(Debug, serde::Serialize)]
struct StreamView {
    stream: u16,
    epoch: u32,
    base_seq: u64,
    resume_seq: u64,
    seq_limit: u64,
    checkpoint: CheckpointView,
    recovered: Option<RecoveredView>,
    durable_seq: Option<u64>,
    chain: Vec<SegmentView>,
}

/// What the next crash recovery of this image replays, against the replay budget.
#[derive(Debug, serde::Serialize)]
struct ReplayView {
    /// The replay budget a mount uses unless told otherwise (`-o replay_budget_mib=N`): a
    /// mount option, not stored in the image.
    budget_default_mib: u64,
    /// Bytes a crash recovery of this image reads (the mount above: the checkpoint snapshot,
    /// if any, and the log it replays after it); online checkpoints keep the log part under
    /// the budget plus the segments the scan reads around it.
    recovery_read_bytes: u64,
}

/// Everything `tally inspect --json` prints.
#[derive(Debug, serde::Serialize)]
struct Inspection {
    image: String,
    superblocks: Vec<CopyReport>,
    superblock: SuperblockView,
    streams: Vec<StreamView>,
    from_snapshot: bool,
    free_segments: Option<u32>,
    mount: Option<MountReport>,
    replay: Option<ReplayView>,
    error: Option<String>,
}

/// Run `tally inspect`.
pub fn run(args: &Args) -> ExitCode {
    let image = match crate::image::join_images(&args.images) {
        Ok(image) => image,
        Err(text) => {
            eprintln!("tally inspect: error: {text}");
            return ExitCode::from(crate::EXIT_BAD_INPUT);
        }
    };
    let opened = match open_image(&image, "inspect", false) {
        Ok(o) => o,
        Err(stop) => {
            eprintln!("tally inspect: error: {}", stop.text);
            return ExitCode::from(stop.code);
        }
    };
    let Some(sb) = opened
        .copies
        .iter()
        .filter_map(|(c, sb)| sb.as_ref().map(|sb| (c.block, sb)))
        .max_by_key(|(_, sb)| sb.generation)
    else {
        // open_image refuses an image without a valid copy; nothing to show.
        return ExitCode::from(crate::fsck::EXIT_UNUSABLE);
    };
    let mut view = Inspection {
        image: image.display().to_string(),
        superblocks: opened.copies.iter().map(|(c, _)| c.clone()).collect(),
        superblock: superblock_view(sb.0, sb.1),
        streams: sb.1.streams.iter().enumerate().map(|(i, root)| stream_view(i, root)).collect(),
        from_snapshot: sb.1.snapshot.is_some(),
        free_segments: None,
        mount: None,
        replay: None,
        error: None,
    };
    let mut code = 0;
    // Two views over the untouched one: recovery of the log alone, then the file system (whose
    // mount marks dead records, which the live ratios need).
    let view_a: Arc<dyn Device> = Arc::new(OverlayDevice::new(opened.dev.clone()));
    let view_b: Arc<dyn Device> = Arc::new(OverlayDevice::new(opened.dev.clone()));
    let bar = crate::fsck::progress_bar(args.json);
    bar.set_message("recovering (in memory)");
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    match Log::open(view_a, OpenOptions::default()) {
        Ok((log, recovery)) => {
            add_recovery(&mut view, &recovery);
            drop(log);
        }
        Err(e) => {
            view.error = Some(format!("log recovery failed: {e}"));
            code = EXIT_CORRUPT;
        }
    }
    if code == 0 {
        match Fs::mount(view_b, MountOptions::default()) {
            Ok(fs) => {
                if let Err(e) = add_usage(&mut view, &fs) {
                    view.error = Some(format!("cannot measure the segments: {e}"));
                    code = EXIT_CORRUPT;
                }
            }
            Err(e) => {
                view.error = Some(format!("cannot mount the file system: {e}"));
                code = classify_mount_error(&e);
            }
        }
    }
    bar.finish_and_clear();
    if args.json {
        match serde_json::to_string_pretty(&view) {
            Ok(text) => println!("{text}"),
            Err(e) => eprintln!("tally inspect: error: cannot encode: {e}"),
        }
    } else {
        print_text(&view);
        if let Some(e) = &view.error {
            eprintln!("tally inspect: error: {e}");
        }
    }
    ExitCode::from(code)
}

fn superblock_view(copy_block: u64, sb: &Superblock) -> SuperblockView {
    SuperblockView {
        copy_block,
        generation: sb.generation,
        uuid: sb.uuid.iter().map(|b| format!("{b:02x}")).collect(),
        block_size: sb.block_size,
        block_count: sb.block_count,
        segment_blocks: sb.segment_blocks,
        segment_count: sb.segment_count,
        first_segment_block: sb.first_segment_block,
        snapshot_segment: sb.snapshot,
        checkpoint_snapshot_generation: sb.snapshot_generation,
    }
}

fn stream_view(i: usize, root: &tally_log::format::superblock::StreamRoot) -> StreamView {
    StreamView {
        stream: i as u16,
        epoch: root.epoch,
        base_seq: root.base_seq,
        resume_seq: root.resume_seq,
        seq_limit: root.seq_limit,
        checkpoint: CheckpointView {
            seq: root.checkpoint_seq,
            epoch: root.checkpoint_epoch,
            segment: root.checkpoint_segment,
            offset: root.checkpoint_offset,
            next_segment: root.checkpoint_next_segment,
        },
        recovered: None,
        durable_seq: None,
        chain: Vec::new(),
    }
}

fn add_recovery(view: &mut Inspection, recovery: &Recovery) {
    for (s, r) in view.streams.iter_mut().zip(&recovery.streams) {
        s.recovered = Some(RecoveredView {
            transactions: r.txs.len() as u64,
            first_seq: r.txs.first().map(|t| t.id.seq),
            last_seq: r.txs.last().map(|t| t.id.seq),
            cut_by_dependency: r.cut_by_dependency as u64,
            epoch_after_recovery: r.epoch,
        });
    }
}

fn add_usage(view: &mut Inspection, fs: &Fs) -> tally_fs::Result<()> {
    let log = fs.log();
    view.free_segments = Some(log.free_segments());
    view.mount = Some(fs.mount_report());
    let liveness = fs.segment_liveness()?;
    for s in &mut view.streams {
        s.durable_seq = Some(log.durable_seq(s.stream));
        s.chain = liveness
            .iter()
            .filter(|u| u.stream == s.stream)
            .map(|u| SegmentView {
                segment: u.segment,
                transactions: u.transactions,
                bytes: u.bytes,
                live_bytes: u.live_bytes,
                live_ratio: (u.bytes > 0).then(|| u.live_bytes as f64 / u.bytes as f64),
            })
            .collect();
    }
    view.replay = Some(ReplayView {
        budget_default_mib: tally_fs::REPLAY_BUDGET_DEFAULT >> 20,
        recovery_read_bytes: fs
            .mount_report()
            .blocks_read
            .saturating_mul(u64::from(fs.block_size())),
    });
    Ok(())
}

fn print_text(v: &Inspection) {
    let sb = &v.superblock;
    println!("image {}", v.image);
    for c in &v.superblocks {
        match (&c.generation, &c.error) {
            (Some(g), _) => println!("  superblock copy at block {}: generation {g}", c.block),
            (None, e) => println!(
                "  superblock copy at block {}: invalid ({})",
                c.block,
                e.as_deref().unwrap_or("?")
            ),
        }
    }
    println!(
        "  in force: copy at block {}, generation {}, uuid {}",
        sb.copy_block, sb.generation, sb.uuid
    );
    println!(
        "  geometry: {} blocks of {} bytes; {} segments of {} blocks from block {}",
        sb.block_count, sb.block_size, sb.segment_count, sb.segment_blocks, sb.first_segment_block
    );
    match (sb.snapshot_segment, sb.checkpoint_snapshot_generation) {
        (Some(seg), Some(generation)) => println!(
            "  snapshot: a checkpoint snapshot (generation {generation}) starts at segment {seg}: \
             the last checkpoint; a crash recovery reads it, then replays what each stream \
             logged after the position the snapshot records (not from the stream's checkpoint \
             below, which only cleaning moves)"
        ),
        (Some(seg), None) => println!(
            "  snapshot: a clean unmount's snapshot starts at segment {seg} (the next mount reads \
             it instead of scanning)"
        ),
        (None, _) => {
            println!("  snapshot: none (the next mount scans the log from each checkpoint)");
        }
    }
    if let Some(free) = v.free_segments {
        println!("  free segments: {free} of {}", sb.segment_count);
    }
    if let Some(m) = &v.mount {
        println!(
            "  file system: {} inodes; mount read {} blocks, replayed {} transactions",
            m.inodes, m.blocks_read, m.transactions_replayed
        );
    }
    if let Some(r) = &v.replay {
        println!(
            "  replay: a crash recovery reads {} KiB (the checkpoint snapshot and the log after \
             it); replay budget {} MiB by default (`tally mount -o replay_budget_mib=N`, not \
             stored in the image): a mount writes a checkpoint snapshot once that much log is \
             written after the last one",
            r.recovery_read_bytes.div_ceil(1024),
            r.budget_default_mib
        );
    }
    for s in &v.streams {
        let c = &s.checkpoint;
        println!(
            "stream {}: epoch {} (since seq {}, resuming at {}, numbers reserved below {})",
            s.stream, s.epoch, s.base_seq, s.resume_seq, s.seq_limit
        );
        println!(
            "  checkpoint: seq {} (epoch {}) applied; the log continues at segment {} block {}, \
             then segment {}",
            c.seq, c.epoch, c.segment, c.offset, c.next_segment
        );
        // The per-stream picture: checkpointed | durable in the log | dropped.
        // With a checkpoint snapshot, what recovery keeps is what the stream logged after the
        // snapshot's position, replayed on top of it; with a clean unmount's, nothing.
        let checkpoint_snapshot = v.superblock.checkpoint_snapshot_generation.is_some();
        let base = if checkpoint_snapshot {
            "[the checkpoint snapshot's state]".to_owned()
        } else {
            format!("[checkpoint <= {}]", c.seq)
        };
        let picture = match &s.recovered {
            Some(r) if v.from_snapshot && !checkpoint_snapshot => format!(
                "[checkpoint <= {}] + the snapshot's state; nothing to replay (epoch {} after \
                 mount)",
                c.seq, r.epoch_after_recovery
            ),
            Some(r) => match (r.first_seq, r.last_seq) {
                (Some(a), Some(b)) => format!(
                    "{base}[durable in the log: seq {a}..={b}, {} transactions]{}",
                    r.transactions,
                    if r.cut_by_dependency > 0 {
                        format!(
                            "[dropped: {} whose dependency did not survive]",
                            r.cut_by_dependency
                        )
                    } else {
                        String::new()
                    }
                ),
                _ => format!("{base}[nothing after it in the log]"),
            },
            None => "recovery did not run".to_owned(),
        };
        println!("  durable: {picture}");
        if let Some(d) = s.durable_seq {
            println!("  durable watermark after recovery: seq {d}");
        }
        if !s.chain.is_empty() {
            let chain: Vec<String> = s
                .chain
                .iter()
                .map(|g| match g.live_ratio {
                    Some(r) => format!(
                        "{} ({} tx, {} of {} KiB live, {:.0}%)",
                        g.segment,
                        g.transactions,
                        g.live_bytes.div_ceil(1024),
                        g.bytes.div_ceil(1024),
                        r * 100.0
                    ),
                    None => format!("{} (empty)", g.segment),
                })
                .collect();
            println!("  chain: {}", chain.join(" -> "));
        }
    }
}
