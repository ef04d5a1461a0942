//! The SQLite peer of the atomic multi-file update: `files` database files, the first opened
//! and the others ATTACHed, each in rollback-journal mode (`journal_mode=DELETE`) with
//! `synchronous=FULL`, each holding one row with a 4 KiB blob. One transaction updates the
//! blob in every database; SQLite makes that atomic across the files with a super-journal
//! (<https://www.sqlite.org/atomiccommit.html>, "Multi-file Commit"). This is SQLite's
//! documented way to update several files atomically, and the one Tally's explicit transactions
//! replace.

use std::path::Path;

use rusqlite::{params, Connection};

use crate::BenchError;

fn lite_err(e: rusqlite::Error) -> BenchError {
    BenchError::Failed { reason: format!("sqlite: {e}") }
}

/// A connection with its databases attached.
pub struct Attached {
    conn: Connection,
    files: u32,
    blob_bytes: usize,
}

fn schema(i: u32) -> String {
    if i == 0 {
        "main".into()
    } else {
        format!("d{i}")
    }
}

impl Attached {
    /// Make `files` databases in `dir`, each with one row holding a `blob_bytes` blob, and
    /// attach them to one connection.
    ///
    /// # Errors
    /// SQLite failures, or a journal mode SQLite refused.
    pub fn open(dir: &Path, files: u32, blob_bytes: usize) -> Result<Attached, BenchError> {
        let conn = Connection::open(dir.join("db0.sqlite")).map_err(lite_err)?;
        for i in 1..files {
            let path = dir.join(format!("db{i}.sqlite"));
            let path = path.to_str().ok_or_else(|| BenchError::BadInput {
                reason: format!("{} is not UTF-8", path.display()),
            })?;
            conn.execute(&format!("ATTACH DATABASE ?1 AS {}", schema(i)), params![path])
                .map_err(lite_err)?;
        }
        for i in 0..files {
            let s = schema(i);
            let mode: String = conn
                .query_row(&format!("PRAGMA {s}.journal_mode=DELETE"), [], |r| r.get(0))
                .map_err(lite_err)?;
            if !mode.eq_ignore_ascii_case("delete") {
                return Err(BenchError::Failed {
                    reason: format!("sqlite kept journal_mode {mode} for {s}"),
                });
            }
            conn.execute_batch(&format!(
                "PRAGMA {s}.synchronous=FULL;
                 CREATE TABLE {s}.t(k INTEGER PRIMARY KEY, v BLOB NOT NULL);"
            ))
            .map_err(lite_err)?;
            conn.execute(&format!("INSERT INTO {s}.t VALUES (1, zeroblob(?1))"), [blob_bytes])
                .map_err(lite_err)?;
        }
        Ok(Attached { conn, files, blob_bytes })
    }

    /// One transaction: the blob of every database replaced (its first bytes are `n`).
    ///
    /// # Errors
    /// SQLite failures.
    pub fn update(&mut self, n: u64) -> Result<(), BenchError> {
        let mut blob = vec![0u8; self.blob_bytes];
        blob[..8].copy_from_slice(&n.to_le_bytes());
        let tx = self.conn.transaction().map_err(lite_err)?;
        for i in 0..self.files {
            let mut stmt = tx
                .prepare_cached(&format!("UPDATE {}.t SET v = ?1 WHERE k = 1", schema(i)))
                .map_err(lite_err)?;
            let changed = stmt.execute([&blob]).map_err(lite_err)?;
            if changed != 1 {
                return Err(BenchError::Failed {
                    reason: format!("sqlite updated {changed} rows of {}", schema(i)),
                });
            }
        }
        tx.commit().map_err(lite_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_attached_database_is_updated_in_rollback_mode() {
        let dir =
            std::env::temp_dir().join(format!("tally-bench-sqlite-test.{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut a = Attached::open(&dir, 3, 4096).unwrap();
        a.update(7).unwrap();
        a.update(9).unwrap();
        drop(a);
        for i in 0..3 {
            let c = Connection::open(dir.join(format!("db{i}.sqlite"))).unwrap();
            let v: Vec<u8> = c.query_row("SELECT v FROM t WHERE k = 1", [], |r| r.get(0)).unwrap();
            assert_eq!(v.len(), 4096);
            assert_eq!(v[..8], 9u64.to_le_bytes());
            let mode: String = c.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
            assert_eq!(mode, "delete");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
