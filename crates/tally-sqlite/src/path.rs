//! Names SQLite passes to the VFS, as paths in the `Fs` tree: `/`-separated, from the root
//! (a name without a leading `/` is taken from the root too); empty components and `.` are
//! skipped; `..` is refused, since SQLite itself never makes one.

use tally_fs::{FileKind, Fs, FsError, Ino, ROOT};

/// Why a name does not resolve.
#[derive(Debug)]
pub(crate) enum PathError {
    /// A `..`, or no name at all.
    Bad,
    /// A directory on the way is missing or is not a directory.
    Lookup,
}

impl From<FsError> for PathError {
    fn from(_: FsError) -> Self {
        PathError::Lookup
    }
}

/// The components of `path`.
fn components(path: &[u8]) -> Result<Vec<&[u8]>, PathError> {
    let parts: Vec<&[u8]> =
        path.split(|&c| c == b'/').filter(|p| !p.is_empty() && *p != b".").collect();
    if parts.iter().any(|p| *p == b"..") {
        return Err(PathError::Bad);
    }
    Ok(parts)
}

/// The directory holding `path`'s last component, and that component.
pub(crate) fn parent<'p>(fs: &Fs, path: &'p [u8]) -> Result<(Ino, &'p [u8]), PathError> {
    let parts = components(path)?;
    let Some((&name, dirs)) = parts.split_last() else { return Err(PathError::Bad) };
    let mut dir = ROOT;
    for &d in dirs {
        let attr = fs.lookup(dir, d)?;
        if attr.kind != FileKind::Dir {
            return Err(PathError::Lookup);
        }
        dir = attr.ino;
    }
    Ok((dir, name))
}

/// The canonical form SQLite keeps as the database's full name: `/` and the components.
pub(crate) fn canonical(path: &[u8]) -> Result<Vec<u8>, PathError> {
    let parts = components(path)?;
    if parts.is_empty() {
        return Err(PathError::Bad);
    }
    let mut out = Vec::with_capacity(path.len() + 1);
    for p in parts {
        out.push(b'/');
        out.extend_from_slice(p);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_names_start_at_the_root() {
        assert_eq!(canonical(b"db.sqlite").unwrap(), b"/db.sqlite");
        assert_eq!(canonical(b"//a/./b-journal").unwrap(), b"/a/b-journal");
        assert!(canonical(b"/a/../b").is_err());
        assert!(canonical(b"/").is_err());
    }
}
