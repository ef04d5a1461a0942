//! A small `sqlite3`-style shell built with the workspace's SQLite, which has
//! `SQLITE_ENABLE_BATCH_ATOMIC_WRITE` (`.cargo/config.toml`): on a `tally mount` its rollback-mode
//! commits go through F2FS's atomic-write ioctls, one flush and no `-journal` file. Debian's
//! `sqlite3` (and its `libsqlite3`) is built without the flag and journals every commit.
//!
//! ```text
//! cargo build --release -p tally-sqlite --example sqlite3
//! target/release/examples/sqlite3 /mnt/tally/app.db 'CREATE TABLE t(x); INSERT INTO t VALUES (1)'
//! target/release/examples/sqlite3 /mnt/tally/app.db < script.sql
//! ```
//!
//! Each argument after the database is run as SQL; with none, SQL is read from standard input,
//! a statement at a time (a prompt when it is a terminal). Rows print in the list mode of
//! SQLite's shell (`|` between columns, `NULL` as empty). Dot commands: `.tables`, `.schema`,
//! `.quit`. The shell sets nothing: `PRAGMA journal_mode` stays `DELETE`, the mode the
//! batch-atomic commit needs, unless the database says otherwise.

use std::ffi::CString;
use std::io::{BufRead, IsTerminal, Write};

use rusqlite::types::ValueRef;
use rusqlite::{Batch, Connection};

/// Run every statement of `sql`, printing the rows of those that return some.
fn run(conn: &Connection, sql: &str, out: &mut impl Write) -> rusqlite::Result<()> {
    let mut batch = Batch::new(conn, sql);
    while let Some(mut stmt) = batch.next_statement()? {
        let columns = stmt.column_count();
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let mut line = String::new();
            for i in 0..columns {
                if i > 0 {
                    line.push('|');
                }
                match row.get_ref(i)? {
                    ValueRef::Null => {}
                    ValueRef::Integer(v) => line.push_str(&v.to_string()),
                    ValueRef::Real(v) => line.push_str(&v.to_string()),
                    ValueRef::Text(t) => line.push_str(&String::from_utf8_lossy(t)),
                    ValueRef::Blob(b) => line.push_str(&String::from_utf8_lossy(b)),
                }
            }
            // A closed pipe ends the output, not the shell.
            let _ = writeln!(out, "{line}");
        }
    }
    Ok(())
}

/// The next statement of `batch`, if any.
trait NextStatement<'conn> {
    fn next_statement(&mut self) -> rusqlite::Result<Option<rusqlite::Statement<'conn>>>;
}

impl<'conn> NextStatement<'conn> for Batch<'conn, '_> {
    fn next_statement(&mut self) -> rusqlite::Result<Option<rusqlite::Statement<'conn>>> {
        // `Batch` is a `fallible_iterator::FallibleIterator`; called by path, not imported.
        rusqlite::fallible_iterator::FallibleIterator::next(self)
    }
}

/// A dot command's SQL, or `None` to quit.
fn dot_command(line: &str) -> Option<Result<String, String>> {
    let sql = match line.split_whitespace().next().unwrap_or_default() {
        ".quit" | ".exit" => return None,
        ".tables" => "SELECT name FROM sqlite_schema WHERE type IN ('table','view') \
                      AND name NOT LIKE 'sqlite_%' ORDER BY 1"
            .to_owned(),
        ".schema" => "SELECT sql || ';' FROM sqlite_schema WHERE sql IS NOT NULL".to_owned(),
        other => return Some(Err(format!("unknown command {other}: .tables .schema .quit"))),
    };
    Some(Ok(sql))
}

/// Whether `sql` ends with a complete statement (SQLite's own `sqlite3_complete`).
fn complete(sql: &str) -> bool {
    let Ok(c) = CString::new(sql) else { return true };
    // SAFETY: a valid NUL-terminated string.
    unsafe { rusqlite::ffi::sqlite3_complete(c.as_ptr()) != 0 }
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: sqlite3 DATABASE [SQL ...]");
        return std::process::ExitCode::from(2);
    };
    let conn = match Connection::open(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("Error: unable to open database \"{path}\": {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout().lock();
    let mut failed = false;
    let report = |r: rusqlite::Result<()>, failed: &mut bool| {
        if let Err(e) = r {
            eprintln!("Error: {e}");
            *failed = true;
        }
    };
    if args.len() > 1 {
        for sql in &args[1..] {
            match sql.starts_with('.').then(|| dot_command(sql)) {
                Some(None) => break,
                Some(Some(Ok(q))) => report(run(&conn, &q, &mut out), &mut failed),
                Some(Some(Err(e))) => {
                    eprintln!("Error: {e}");
                    failed = true;
                }
                None => report(run(&conn, sql, &mut out), &mut failed),
            }
        }
    } else {
        let stdin = std::io::stdin();
        let prompt = stdin.is_terminal();
        let mut pending = String::new();
        let mut lines = stdin.lock().lines();
        loop {
            if prompt {
                let _ = write!(out, "{}", if pending.is_empty() { "sqlite> " } else { "   ...> " });
                let _ = out.flush();
            }
            let Some(Ok(line)) = lines.next() else { break };
            if pending.is_empty() && line.trim_start().starts_with('.') {
                match dot_command(line.trim()) {
                    None => break,
                    Some(Ok(q)) => report(run(&conn, &q, &mut out), &mut failed),
                    Some(Err(e)) => {
                        eprintln!("Error: {e}");
                        failed = true;
                    }
                }
                continue;
            }
            pending.push_str(&line);
            pending.push('\n');
            if complete(&pending) {
                report(run(&conn, &pending, &mut out), &mut failed);
                pending.clear();
            }
        }
        if !pending.trim().is_empty() {
            report(run(&conn, &pending, &mut out), &mut failed);
        }
    }
    if failed {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    }
}
