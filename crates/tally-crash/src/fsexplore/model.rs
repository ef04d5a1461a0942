//! The reference model of the file system: a plain in-memory tree, the operations of a
//! workload resolved against it, what each operation touches, what was acknowledged durable,
//! and the check that judges a recovered tree.
//!
//! Invariants of the model itself: every node but the root is named by at least one entry
//! (a file whose last name goes is removed; a directory is removed with its entry); directories
//! hold entries, files hold bytes. Model inode numbers are the explorer's own (`MIno`), never the
//! file system's: trees are compared by path.

use std::collections::{BTreeMap, BTreeSet};

/// A model inode number.
pub type MIno = u32;

/// The model's root directory.
pub const MROOT: MIno = 0;

/// One node of the model tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MNode {
    /// A directory (else a regular file).
    pub dir: bool,
    /// Permission bits.
    pub perm: u16,
    /// File contents (holes are zeros); empty for directories.
    pub data: Vec<u8>,
    /// Extended attributes.
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Directory entries.
    pub entries: BTreeMap<Vec<u8>, MIno>,
    /// Names of a file (directories: 1 while they exist).
    pub links: u32,
}

impl MNode {
    fn new(dir: bool, perm: u16) -> MNode {
        MNode {
            dir,
            perm,
            data: Vec::new(),
            xattrs: BTreeMap::new(),
            entries: BTreeMap::new(),
            links: 1,
        }
    }
}

/// The model tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MState {
    /// Every live node.
    pub nodes: BTreeMap<MIno, MNode>,
    /// Next model inode number.
    pub next: MIno,
}

impl Default for MState {
    fn default() -> Self {
        let mut nodes = BTreeMap::new();
        nodes.insert(MROOT, MNode::new(true, 0o755));
        MState { nodes, next: MROOT + 1 }
    }
}

/// An operation resolved against the model: inode numbers instead of paths, bytes and sizes
/// decided. Applying it to a state where its preconditions fail is an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MOp {
    /// `create` or `mkdir` of `new` as `name` in `dir`.
    Create {
        /// Parent.
        dir: MIno,
        /// Name.
        name: Vec<u8>,
        /// The new node's model number.
        new: MIno,
        /// A directory.
        is_dir: bool,
        /// Permission bits.
        perm: u16,
    },
    /// `write`.
    Write {
        /// File.
        ino: MIno,
        /// Offset.
        off: u64,
        /// Bytes.
        data: Vec<u8>,
    },
    /// `truncate` (down or up).
    SetSize {
        /// File.
        ino: MIno,
        /// New size.
        size: u64,
    },
    /// `chmod`.
    Chmod {
        /// Node.
        ino: MIno,
        /// New permission bits.
        perm: u16,
    },
    /// `setxattr`.
    SetXattr {
        /// Node.
        ino: MIno,
        /// Attribute name.
        name: Vec<u8>,
        /// Value.
        value: Vec<u8>,
    },
    /// `removexattr`.
    RemoveXattr {
        /// Node.
        ino: MIno,
        /// Attribute name.
        name: Vec<u8>,
    },
    /// `link`.
    Link {
        /// File.
        ino: MIno,
        /// Directory of the new name.
        dir: MIno,
        /// New name.
        name: Vec<u8>,
    },
    /// `unlink`.
    Unlink {
        /// Directory.
        dir: MIno,
        /// Name.
        name: Vec<u8>,
    },
    /// `rmdir`.
    Rmdir {
        /// Parent.
        dir: MIno,
        /// Name.
        name: Vec<u8>,
    },
    /// `rename` (replacing an existing target).
    Rename {
        /// Source directory.
        sdir: MIno,
        /// Source name.
        sname: Vec<u8>,
        /// Target directory.
        ddir: MIno,
        /// Target name.
        dname: Vec<u8>,
    },
    /// An explicit transaction that committed: its operations, all or nothing.
    Group(Vec<MOp>),
}

impl MOp {
    /// Whether the operation changes a directory's entries (create, mkdir, link, unlink,
    /// rmdir, rename; a transaction holding one): a namespace change, which every later
    /// operation is ordered after and every later durable wait makes durable (`docs/FS.md`,
    /// "Durability of names").
    #[must_use]
    pub fn changes_names(&self) -> bool {
        match self {
            MOp::Create { .. }
            | MOp::Link { .. }
            | MOp::Unlink { .. }
            | MOp::Rmdir { .. }
            | MOp::Rename { .. } => true,
            MOp::Group(ops) => ops.iter().any(MOp::changes_names),
            MOp::Write { .. }
            | MOp::SetSize { .. }
            | MOp::Chmod { .. }
            | MOp::SetXattr { .. }
            | MOp::RemoveXattr { .. } => false,
        }
    }
}

impl MState {
    /// The node `ino`.
    #[must_use]
    pub fn node(&self, ino: MIno) -> Option<&MNode> {
        self.nodes.get(&ino)
    }

    /// Resolve an absolute path (`/`, `/A/foo`).
    #[must_use]
    pub fn lookup(&self, path: &str) -> Option<MIno> {
        let mut ino = MROOT;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            ino = *self.nodes.get(&ino)?.entries.get(part.as_bytes())?;
        }
        Some(ino)
    }

    /// Every path and the node it names, parents before children, entries by name. A directory
    /// reached twice is not walked twice.
    #[must_use]
    pub fn paths(&self) -> Vec<(String, MIno)> {
        let mut out = vec![("/".to_string(), MROOT)];
        let mut seen = BTreeSet::from([MROOT]);
        let mut i = 0;
        while i < out.len() {
            let (path, ino) = out[i].clone();
            i += 1;
            let Some(node) = self.nodes.get(&ino) else { continue };
            for (name, &child) in &node.entries {
                let p = join(&path, &String::from_utf8_lossy(name));
                let walk = self.nodes.get(&child).is_some_and(|c| c.dir) && seen.insert(child);
                if walk || !self.nodes.get(&child).is_some_and(|c| c.dir) {
                    out.push((p, child));
                }
            }
        }
        out
    }

    /// Apply `op`; returns the model inodes it touched. Fails (leaving `self` partly changed:
    /// apply to a clone) when a precondition does not hold.
    ///
    /// # Errors
    /// The precondition that failed.
    pub fn apply(&mut self, op: &MOp) -> Result<BTreeSet<MIno>, String> {
        let mut touched = BTreeSet::new();
        match op {
            MOp::Create { dir, name, new, is_dir, perm } => {
                let d = self.dir_mut(*dir)?;
                if d.entries.contains_key(name) {
                    return Err("create: name exists".into());
                }
                d.entries.insert(name.clone(), *new);
                if self.nodes.contains_key(new) {
                    return Err("create: node exists".into());
                }
                self.nodes.insert(*new, MNode::new(*is_dir, *perm));
                self.next = self.next.max(new + 1);
                touched.extend([*dir, *new]);
            }
            MOp::Write { ino, off, data } => {
                let f = self.file_mut(*ino)?;
                let end = *off as usize + data.len();
                if f.data.len() < end {
                    f.data.resize(end, 0);
                }
                f.data[*off as usize..end].copy_from_slice(data);
                touched.insert(*ino);
            }
            MOp::SetSize { ino, size } => {
                self.file_mut(*ino)?.data.resize(*size as usize, 0);
                touched.insert(*ino);
            }
            MOp::Chmod { ino, perm } => {
                self.nodes.get_mut(ino).ok_or("chmod: no node")?.perm = *perm;
                touched.insert(*ino);
            }
            MOp::SetXattr { ino, name, value } => {
                self.nodes
                    .get_mut(ino)
                    .ok_or("setxattr: no node")?
                    .xattrs
                    .insert(name.clone(), value.clone());
                touched.insert(*ino);
            }
            MOp::RemoveXattr { ino, name } => {
                let n = self.nodes.get_mut(ino).ok_or("removexattr: no node")?;
                n.xattrs.remove(name).ok_or("removexattr: no attribute")?;
                touched.insert(*ino);
            }
            MOp::Link { ino, dir, name } => {
                if self.nodes.get(ino).is_none_or(|n| n.dir) {
                    return Err("link: not a file".into());
                }
                let d = self.dir_mut(*dir)?;
                if d.entries.insert(name.clone(), *ino).is_some() {
                    return Err("link: name exists".into());
                }
                self.file_mut(*ino)?.links += 1;
                touched.extend([*dir, *ino]);
            }
            MOp::Unlink { dir, name } => {
                let child = *self.dir_mut(*dir)?.entries.get(name).ok_or("unlink: no entry")?;
                if self.nodes.get(&child).is_none_or(|c| c.dir) {
                    return Err("unlink: a directory".into());
                }
                self.dir_mut(*dir)?.entries.remove(name);
                self.drop_link(child);
                touched.extend([*dir, child]);
            }
            MOp::Rmdir { dir, name } => {
                let child = *self.dir_mut(*dir)?.entries.get(name).ok_or("rmdir: no entry")?;
                let c = self.nodes.get(&child).ok_or("rmdir: no node")?;
                if !c.dir || !c.entries.is_empty() {
                    return Err("rmdir: not an empty directory".into());
                }
                self.dir_mut(*dir)?.entries.remove(name);
                self.nodes.remove(&child);
                touched.extend([*dir, child]);
            }
            MOp::Rename { sdir, sname, ddir, dname } => {
                let src = *self.dir_mut(*sdir)?.entries.get(sname).ok_or("rename: no source")?;
                let dst = self.dir_mut(*ddir)?.entries.get(dname).copied();
                let src_dir = self.nodes.get(&src).is_some_and(|n| n.dir);
                if src_dir && self.within(*ddir, src) {
                    return Err("rename: into its own subtree".into());
                }
                if let Some(dst) = dst {
                    if dst == src {
                        return Err("rename: same inode (a no-op, not modelled)".into());
                    }
                    let d = self.nodes.get(&dst).ok_or("rename: no target node")?;
                    if d.dir != src_dir || (d.dir && !d.entries.is_empty()) {
                        return Err("rename: incompatible target".into());
                    }
                    touched.insert(dst);
                    if d.dir {
                        self.nodes.remove(&dst);
                    } else {
                        self.drop_link(dst);
                    }
                }
                self.dir_mut(*sdir)?.entries.remove(sname);
                self.dir_mut(*ddir)?.entries.insert(dname.clone(), src);
                touched.extend([*sdir, *ddir, src]);
            }
            MOp::Group(ops) => {
                for op in ops {
                    touched.extend(self.apply(op)?);
                }
            }
        }
        Ok(touched)
    }

    fn dir_mut(&mut self, ino: MIno) -> Result<&mut MNode, String> {
        match self.nodes.get_mut(&ino) {
            Some(n) if n.dir => Ok(n),
            _ => Err(format!("no directory {ino}")),
        }
    }

    fn file_mut(&mut self, ino: MIno) -> Result<&mut MNode, String> {
        match self.nodes.get_mut(&ino) {
            Some(n) if !n.dir => Ok(n),
            _ => Err(format!("no file {ino}")),
        }
    }

    fn drop_link(&mut self, ino: MIno) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.links = n.links.saturating_sub(1);
            if n.links == 0 {
                self.nodes.remove(&ino);
            }
        }
    }

    /// Is `ino` `ancestor` or inside it? (Bounded by the node count: no recursion.)
    fn within(&self, ino: MIno, ancestor: MIno) -> bool {
        let mut parent_of: BTreeMap<MIno, MIno> = BTreeMap::new();
        for (&p, n) in &self.nodes {
            for &c in n.entries.values() {
                if self.nodes.get(&c).is_some_and(|c| c.dir) {
                    parent_of.insert(c, p);
                }
            }
        }
        let mut at = ino;
        for _ in 0..=self.nodes.len() {
            if at == ancestor {
                return true;
            }
            match parent_of.get(&at) {
                Some(&p) => at = p,
                None => return false,
            }
        }
        false
    }

    /// The canonical tree of this state.
    #[must_use]
    pub fn tree(&self) -> Tree {
        let mut raw = Vec::new();
        for (path, ino) in self.paths() {
            let Some(n) = self.nodes.get(&ino) else { continue };
            let subdirs =
                n.entries.values().filter(|c| self.nodes.get(c).is_some_and(|c| c.dir)).count()
                    as u32;
            raw.push(RawNode {
                path,
                id: u64::from(ino),
                dir: n.dir,
                perm: n.perm,
                nlink: if n.dir { 2 + subdirs } else { 0 },
                size: n.data.len() as u64,
                data: n.data.clone(),
                xattrs: n.xattrs.clone(),
                dotdot_ok: true,
            });
        }
        Tree::from_raw(raw, true)
    }
}

/// Join a directory path and a name.
#[must_use]
pub fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// A node as a walk found it, before canonicalisation.
#[derive(Debug, Clone)]
pub struct RawNode {
    /// Its path.
    pub path: String,
    /// Identity (inode number) in whatever numbering the walk used.
    pub id: u64,
    /// A directory.
    pub dir: bool,
    /// Permission bits.
    pub perm: u16,
    /// Link count as the walk found it (model files: 0, computed from the names).
    pub nlink: u32,
    /// Size.
    pub size: u64,
    /// Contents (files).
    pub data: Vec<u8>,
    /// Extended attributes.
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// A directory's `..` names its parent.
    pub dotdot_ok: bool,
}

/// One node of a canonical tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeNode {
    /// A directory.
    pub dir: bool,
    /// Permission bits.
    pub perm: u16,
    /// Link count.
    pub nlink: u32,
    /// Size in bytes (files).
    pub size: u64,
    /// Contents (files).
    pub data: Vec<u8>,
    /// Extended attributes.
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The first path (in walk order) that names the same inode: hard links share it.
    pub link: String,
    /// A directory's `..` names its parent.
    pub dotdot_ok: bool,
}

/// A tree by path, independent of inode numbers: what two states are compared by.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tree(pub BTreeMap<String, TreeNode>);

impl Tree {
    /// Canonicalise a walk. With `count_links`, file link counts are the number of paths
    /// naming the inode (the model's truth); otherwise they are taken as found.
    #[must_use]
    pub fn from_raw(raw: Vec<RawNode>, count_links: bool) -> Tree {
        let mut first: BTreeMap<u64, String> = BTreeMap::new();
        let mut names: BTreeMap<u64, u32> = BTreeMap::new();
        for r in &raw {
            first.entry(r.id).or_insert_with(|| r.path.clone());
            *names.entry(r.id).or_default() += 1;
        }
        let mut out = BTreeMap::new();
        for r in raw {
            let nlink = if count_links && !r.dir { names[&r.id] } else { r.nlink };
            let link = first[&r.id].clone();
            out.insert(
                r.path,
                TreeNode {
                    dir: r.dir,
                    perm: r.perm,
                    nlink,
                    size: r.size,
                    data: r.data,
                    xattrs: r.xattrs,
                    link,
                    dotdot_ok: r.dotdot_ok,
                },
            );
        }
        Tree(out)
    }

    /// What differs from `other`, briefly (for messages).
    #[must_use]
    pub fn diff(&self, other: &Tree) -> String {
        let mut out = Vec::new();
        for (p, n) in &self.0 {
            match other.0.get(p) {
                None => out.push(format!("{p} only in recovered")),
                Some(m) if m != n => {
                    out.push(format!("{p}: recovered {} vs {}", n.brief(), m.brief()))
                }
                _ => {}
            }
        }
        for p in other.0.keys().filter(|p| !self.0.contains_key(*p)) {
            out.push(format!("{p} missing"));
        }
        out.truncate(6);
        out.join("; ")
    }
}

impl TreeNode {
    fn brief(&self) -> String {
        let crc = crc32c::crc32c(&self.data);
        format!(
            "[{} perm {:o} nlink {} size {} crc {crc:08x} xattrs {} link {}{}]",
            if self.dir { "dir" } else { "file" },
            self.perm,
            self.nlink,
            self.size,
            self.xattrs.len(),
            self.link,
            if self.dotdot_ok { "" } else { " bad .." }
        )
    }
}

/// An invariant of the file-system explorer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum FsInvariant {
    /// I1: the recovered tree is the model's state after some subset of the operations, each
    /// whole or absent.
    I1Atomicity,
    /// I2: that subset is closed under same-object order and barriers (a prefix on one stream).
    I2CausalOrder,
    /// I3: every operation acknowledged durable is in it.
    I3Durability,
    /// I4: mount succeeds without panic on every legal image, and `fsck` is clean.
    I4MountAndFsck,
    /// I5: after recovery, a new file written and fsynced survives a remount.
    I5ForwardProgress,
    /// I6: mounting again after a crash right after recovery gives the same tree.
    I6Idempotence,
}

impl FsInvariant {
    /// Short name, as printed.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            FsInvariant::I1Atomicity => "I1 atomicity",
            FsInvariant::I2CausalOrder => "I2 causal order",
            FsInvariant::I3Durability => "I3 durability",
            FsInvariant::I4MountAndFsck => "I4 mount and fsck",
            FsInvariant::I5ForwardProgress => "I5 forward progress",
            FsInvariant::I6Idempotence => "I6 idempotence",
        }
    }
}

/// A broken invariant, with what was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsViolation {
    /// Which.
    pub invariant: FsInvariant,
    /// What was wrong.
    pub message: String,
}

/// The history of a workload as the model knows it: the start state, the operations that
/// reached the log (committed; aborted transactions are not there), what each depends on, and
/// what was acknowledged durable.
#[derive(Debug, Clone)]
pub struct History {
    /// State before the workload (durable).
    pub base: MState,
    /// Operations in order.
    pub ops: Vec<MOp>,
    /// What each touched.
    pub touched: Vec<BTreeSet<MIno>>,
    /// Per operation: the earlier operations it must not survive without (bit masks).
    pub deps: Vec<u64>,
    /// Operations acknowledged durable (closed under `deps`).
    pub acked: u64,
    /// Earlier operations every later operation depends on (barriers).
    barrier: u64,
    /// The namespace changes so far, with what they depend on: every durable wait
    /// acknowledges them (with [`History::names_ordered`]).
    names: u64,
    /// One stream: every survivor set must be a prefix.
    pub total_order: bool,
    /// Namespace changes are barriers and every durable wait makes the earlier ones durable
    /// (the file system's rule). Off where the history's order is not the order the
    /// operations ran in (two OS threads at once, whose history is one thread's operations
    /// after the other's).
    pub names_ordered: bool,
}

/// Most operations a history may hold: subsets are enumerated.
pub const HISTORY_OPS_MAX: usize = 12;

impl History {
    /// An empty history from `base`.
    #[must_use]
    pub fn new(base: MState, total_order: bool) -> History {
        History {
            base,
            ops: Vec::new(),
            touched: Vec::new(),
            deps: Vec::new(),
            acked: 0,
            barrier: 0,
            names: 0,
            total_order,
            names_ordered: true,
        }
    }

    /// Append an operation that reached the log, with what it touched.
    pub fn push(&mut self, op: MOp, touched: BTreeSet<MIno>) {
        let mut deps = self.barrier;
        for (i, t) in self.touched.iter().enumerate() {
            if !t.is_disjoint(&touched) {
                deps |= 1 << i;
            }
        }
        let names = self.names_ordered && op.changes_names();
        self.ops.push(op);
        self.touched.push(touched);
        self.deps.push(deps);
        if names {
            let this = self.closure(1 << (self.ops.len() - 1));
            self.barrier |= this;
            self.names |= this;
        }
    }

    /// The earlier operations that touched `ino`.
    #[must_use]
    pub fn touching(&self, ino: MIno) -> u64 {
        self.touched
            .iter()
            .enumerate()
            .filter(|(_, t)| t.contains(&ino))
            .fold(0, |m, (i, _)| m | 1 << i)
    }

    /// `set` and everything it depends on, transitively.
    #[must_use]
    pub fn closure(&self, mut set: u64) -> u64 {
        for j in (0..self.ops.len()).rev() {
            if set & 1 << j != 0 {
                set |= self.deps[j];
            }
        }
        set
    }

    /// `fsync`/`fdatasync` of `ino` returned (or `commit_durable` of an op set): acknowledge.
    pub fn ack(&mut self, set: u64) {
        self.acked |= self.closure(set) | self.names;
    }

    /// `sync()` returned.
    pub fn ack_all(&mut self) {
        self.acked = self.all();
    }

    /// `barrier(ino)` returned: later operations depend on `ino`'s earlier ones.
    pub fn barrier(&mut self, ino: MIno) {
        self.barrier |= self.closure(self.touching(ino));
    }

    fn all(&self) -> u64 {
        (1u64 << self.ops.len()) - 1
    }

    /// Is `mask` a legal survivor set for the order (I2)?
    #[must_use]
    pub fn closed(&self, mask: u64) -> bool {
        if self.total_order && mask & (mask + 1) != 0 {
            return false; // not a prefix
        }
        (0..self.ops.len()).all(|j| mask & 1 << j == 0 || self.deps[j] & !mask == 0)
    }

    /// The tree after the operations of `mask`, or `None` if they do not apply in that order.
    #[must_use]
    pub fn tree_of(&self, mask: u64) -> Option<Tree> {
        let mut st = self.base.clone();
        for (i, op) in self.ops.iter().enumerate() {
            if mask & 1 << i != 0 {
                st.apply(op).ok()?;
            }
        }
        Some(st.tree())
    }

    /// The model's state after every operation.
    #[must_use]
    pub fn full_state(&self) -> Option<MState> {
        let mut st = self.base.clone();
        for op in &self.ops {
            st.apply(op).ok()?;
        }
        Some(st)
    }
}

/// The trees of every subset of a history's operations, made once per crash point and used
/// for every image there.
pub struct Candidates {
    history: History,
    trees: Vec<(u64, Tree)>,
}

impl Candidates {
    /// Every subset's tree (subsets that do not apply are left out).
    #[must_use]
    pub fn new(history: &History) -> Candidates {
        let n = history.ops.len().min(HISTORY_OPS_MAX);
        let trees = (0..1u64 << n).filter_map(|m| history.tree_of(m).map(|t| (m, t))).collect();
        Candidates { history: history.clone(), trees }
    }

    /// Judge a recovered tree: I1 (some subset), I2 (closed), I3 (acknowledged included).
    ///
    /// # Errors
    /// The invariant broken, with the nearest candidate's differences.
    pub fn check(&self, tree: &Tree) -> Result<u64, FsViolation> {
        let h = &self.history;
        let matches: Vec<u64> =
            self.trees.iter().filter(|(_, t)| t == tree).map(|(m, _)| *m).collect();
        if let Some(&m) = matches.iter().find(|&&m| h.closed(m) && m & h.acked == h.acked) {
            return Ok(m);
        }
        // Operation 0 first, as the messages say.
        let fmt = |m: u64| -> String {
            format!("{m:0width$b}", width = h.ops.len().max(1)).chars().rev().collect()
        };
        if matches.is_empty() {
            let nearest = self
                .trees
                .iter()
                .filter(|(m, _)| h.closed(*m) && m & h.acked == h.acked)
                .min_by_key(|(_, t)| tree_distance(tree, t));
            let diff = nearest.map_or("no legal subset applies".into(), |(m, t)| {
                format!("nearest legal subset {}: {}", fmt(*m), tree.diff(t))
            });
            return Err(FsViolation {
                invariant: FsInvariant::I1Atomicity,
                message: format!(
                    "the recovered tree is the state after no subset of the {} operations; {diff}",
                    h.ops.len()
                ),
            });
        }
        if let Some(&m) = matches.iter().find(|&&m| m & h.acked == h.acked) {
            return Err(FsViolation {
                invariant: FsInvariant::I2CausalOrder,
                message: format!(
                    "survivors {} (ops, lowest bit first) are not closed under order{} (deps {:?})",
                    fmt(m),
                    if h.total_order { " (one stream: must be a prefix)" } else { "" },
                    h.deps.iter().map(|d| fmt(*d)).collect::<Vec<_>>()
                ),
            });
        }
        Err(FsViolation {
            invariant: FsInvariant::I3Durability,
            message: format!(
                "acknowledged durable {} but the recovered tree matches only {:?}",
                fmt(h.acked),
                matches.iter().map(|&m| fmt(m)).collect::<Vec<_>>()
            ),
        })
    }
}

fn tree_distance(a: &Tree, b: &Tree) -> usize {
    let keys: BTreeSet<&String> = a.0.keys().chain(b.0.keys()).collect();
    keys.into_iter().filter(|k| a.0.get(*k) != b.0.get(*k)).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> MState {
        let mut st = MState::default();
        st.apply(&MOp::Create {
            dir: MROOT,
            name: b"A".to_vec(),
            new: 1,
            is_dir: true,
            perm: 0o755,
        })
        .unwrap();
        st.apply(&MOp::Create {
            dir: 1,
            name: b"foo".to_vec(),
            new: 2,
            is_dir: false,
            perm: 0o644,
        })
        .unwrap();
        st
    }

    #[test]
    fn rename_and_link_counts() {
        let mut st = base();
        st.apply(&MOp::Link { ino: 2, dir: MROOT, name: b"l".to_vec() }).unwrap();
        let t = st.tree();
        assert_eq!(t.0["/A/foo"].nlink, 2);
        assert_eq!(t.0["/A/foo"].link, "/l"); // breadth first: `/l` is met first
        assert_eq!(t.0["/"].nlink, 3);
        st.apply(&MOp::Rename {
            sdir: MROOT,
            sname: b"l".to_vec(),
            ddir: 1,
            dname: b"foo".to_vec(),
        })
        .unwrap_err();
        st.apply(&MOp::Unlink { dir: 1, name: b"foo".to_vec() }).unwrap();
        assert_eq!(st.tree().0["/l"].nlink, 1);
    }

    #[test]
    fn closure_and_barriers() {
        let mut h = History::new(base(), false);
        h.push(MOp::Write { ino: 2, off: 0, data: vec![1] }, [2].into());
        h.push(MOp::Chmod { ino: 1, perm: 0o700 }, [1].into());
        h.push(MOp::Write { ino: 2, off: 1, data: vec![2] }, [2].into());
        assert!(h.closed(0b010));
        assert!(!h.closed(0b100));
        h.barrier(2);
        h.push(MOp::Chmod { ino: 1, perm: 0o711 }, [1].into());
        assert_eq!(h.closure(0b1000), 0b1111);
        let c = Candidates::new(&h);
        let t = h.tree_of(0b101).unwrap();
        assert_eq!(c.check(&t), Ok(0b101));
        let bad = h.tree_of(0b100).unwrap();
        assert_eq!(c.check(&bad).unwrap_err().invariant, FsInvariant::I2CausalOrder);
        h.ack(0b001);
        let c = Candidates::new(&h);
        assert_eq!(c.check(&h.base.tree()).unwrap_err().invariant, FsInvariant::I3Durability);
    }
}
