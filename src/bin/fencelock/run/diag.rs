//! Diagnostics of `fencelock run` on stderr that never hold up the supervisor.
//!
//! stderr is often a pipe (a cron mailer, a log shipper, `2>&1 | tee`) that can fill up
//! or close. `eprintln!` blocks on a full pipe, so a supervisor that logs before it signals
//! could miss the lease deadline by as long as nobody reads, and it panics on a closed one
//! (exit 101). Lines go to a thread of their own through a bounded queue instead: the
//! supervisor never waits for stderr, a line that does not fit in the queue is dropped
//! (and counted), and a write that fails is ignored.

use std::io::Write;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

/// How many lines may wait for a slow stderr.
const QUEUE: usize = 256;

/// What the writer thread is given.
enum Item {
    Line(String),
    /// Answer on the channel once every line before it has been written.
    Flush(SyncSender<()>),
}

struct Writer {
    queue: SyncSender<Item>,
    dropped: Mutex<u64>,
}

fn writer() -> Option<&'static Writer> {
    static WRITER: OnceLock<Option<Writer>> = OnceLock::new();
    WRITER
        .get_or_init(|| {
            let (queue, items) = sync_channel(QUEUE);
            std::thread::Builder::new()
                .name("fencelock-stderr".into())
                .spawn(move || write_lines(&items))
                .ok()?;
            Some(Writer {
                queue,
                dropped: Mutex::new(0),
            })
        })
        .as_ref()
}

fn write_lines(items: &Receiver<Item>) {
    let mut stderr = std::io::stderr();
    for item in items {
        match item {
            Item::Line(line) => {
                // A closed or broken stderr: nothing to be done, and nothing to stop for.
                let _ = stderr.write_all(line.as_bytes());
            }
            Item::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// Queues `fencelock run: <message>` for stderr without waiting.
pub(crate) fn say(message: std::fmt::Arguments<'_>) {
    let line = format!("fencelock run: {message}\n");
    let Some(writer) = writer() else { return };
    match writer.queue.try_send(Item::Line(line)) {
        Ok(()) => {}
        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
            *writer
                .dropped
                .lock()
                .unwrap_or_else(PoisonError::into_inner) += 1;
        }
    }
}

/// Waits at most `limit` for the queued lines to be written (before the process exits,
/// once the lock is released: a stderr nobody reads only costs this long).
pub(crate) fn flush(limit: Duration) {
    let Some(writer) = writer() else { return };
    let dropped = std::mem::take(
        &mut *writer
            .dropped
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    );
    if dropped > 0 {
        say(format_args!(
            "{dropped} diagnostic line(s) dropped: stderr was not being read"
        ));
    }
    let (done, written) = sync_channel(1);
    if writer.queue.try_send(Item::Flush(done)).is_ok() {
        let _ = written.recv_timeout(limit);
    }
}

/// `diag!("...", args)`: [`say`] with `format!` arguments.
macro_rules! diag {
    ($($arg:tt)*) => {
        $crate::run::diag::say(format_args!($($arg)*))
    };
}
pub(crate) use diag;
