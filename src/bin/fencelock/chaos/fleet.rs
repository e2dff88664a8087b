//! The worker processes of one scenario run, and the stream of what they report.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::checker::Section;
use super::events::Event;
use super::worker::WorkerArgs;
use crate::bench::BoxResult;

/// One worker process.
struct Worker {
    child: Child,
    pid: u32,
    // Held open: the worker exits when it closes.
    _stdin: Option<ChildStdin>,
}

/// The workers of a run. Dropping it SIGKILLs every one of them by PID.
pub struct Fleet {
    workers: Vec<Worker>,
    events: mpsc::UnboundedReceiver<(usize, Event)>,
    deadline: Instant,
    /// Every section reported so far.
    pub sections: Vec<Section>,
    /// The last trouble each worker reported (for error messages).
    troubles: Vec<Option<String>>,
}

/// The name of worker `i` in the log.
pub fn client_name(i: usize) -> String {
    format!("c{i}")
}

impl Fleet {
    /// Starts one worker per element of `specs`, with stderr going to `log_dir`.
    pub fn start(specs: Vec<WorkerArgs>, log_dir: &Path, deadline: Instant) -> BoxResult<Self> {
        let exe = std::env::current_exe()?;
        let (sender, events) = mpsc::unbounded_channel();
        let mut workers = Vec::new();
        for (i, spec) in specs.into_iter().enumerate() {
            let stderr = std::fs::File::create(log_dir.join(format!("{}.log", spec.client)))?;
            let mut command = Command::new(&exe);
            // The worker's TLS flags come from its argv alone; the etcd user (with its
            // password) from the environment, not a command line.
            for variable in crate::security::ENV_VARIABLES {
                command.env_remove(variable);
            }
            if let Some(user) = &spec.tls.etcd_user {
                command.env("FENCELOCK_ETCD_USER", user);
            }
            command
                .arg("chaos-worker")
                .args(worker_argv(&spec))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(stderr)
                .kill_on_drop(true);
            let mut child = command.spawn()?;
            let pid = child.id().ok_or("a worker exited at once")?;
            let stdout = child.stdout.take().ok_or("no worker stdout")?;
            let sender = sender.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Ok(event) = serde_json::from_str::<Event>(&line) {
                        if sender.send((i, event)).is_err() {
                            return;
                        }
                    }
                }
            });
            workers.push(Worker {
                _stdin: child.stdin.take(),
                child,
                pid,
            });
        }
        let count = workers.len();
        Ok(Self {
            workers,
            events,
            deadline,
            sections: Vec::new(),
            troubles: vec![None; count],
        })
    }

    /// The next event of any worker, recording sections; fails at the run's deadline.
    pub async fn next(&mut self, waiting_for: &str) -> BoxResult<(usize, Event)> {
        let received = tokio::time::timeout_at(self.deadline, self.events.recv()).await;
        match received {
            Ok(Some((i, event))) => {
                match &event {
                    Event::Section { section } => self.sections.push(section.clone()),
                    Event::Trouble { message, .. } => self.troubles[i] = Some(message.clone()),
                    _ => {}
                }
                Ok((i, event))
            }
            Ok(None) => Err(format!("every worker exited while waiting for {waiting_for}").into()),
            Err(_) => Err(format!(
                "the run's time ran out waiting for {waiting_for}{}",
                self.last_troubles()
            )
            .into()),
        }
    }

    /// Waits for the first event that `wanted` accepts.
    pub async fn wait_for(
        &mut self,
        what: &str,
        mut wanted: impl FnMut(usize, &Event) -> bool,
    ) -> BoxResult<(usize, Event)> {
        loop {
            let (i, event) = self.next(what).await?;
            if wanted(i, &event) {
                return Ok((i, event));
            }
        }
    }

    /// Waits until `more` further sections have ended.
    pub async fn sections_more(&mut self, more: usize) -> BoxResult<()> {
        let target = self.sections.len() + more;
        while self.sections.len() < target {
            self.next(&format!("{more} more critical sections")).await?;
        }
        Ok(())
    }

    /// Waits for a worker that `who` accepts to start working under the lock; returns
    /// (worker, token).
    pub async fn at_work(&mut self, who: impl Fn(usize) -> bool) -> BoxResult<(usize, u64)> {
        let (i, event) = self
            .wait_for("a holder at work", |i, e| {
                who(i) && matches!(e, Event::Working { .. })
            })
            .await?;
        match event {
            Event::Working { token, .. } => Ok((i, token)),
            _ => Err("unreachable: not at work".into()),
        }
    }

    /// Waits for a grant to a worker that `to` accepts; returns (worker, token, at_ns).
    pub async fn grant(&mut self, to: impl Fn(usize) -> bool) -> BoxResult<(usize, u64, u64)> {
        let (i, event) = self
            .wait_for("a grant", |i, e| {
                to(i) && matches!(e, Event::Acquired { .. })
            })
            .await?;
        match event {
            Event::Acquired { token, at_ns, .. } => Ok((i, token, at_ns)),
            _ => Err("unreachable: not a grant".into()),
        }
    }

    /// Waits for the end of a section of worker `who`.
    pub async fn section_of(&mut self, who: usize) -> BoxResult<Section> {
        let (_, event) = self
            .wait_for("the section's end", |i, e| {
                i == who && matches!(e, Event::Section { .. })
            })
            .await?;
        match event {
            Event::Section { section } => Ok(section),
            _ => Err("unreachable: not a section".into()),
        }
    }

    /// Sends `signal` to worker `i` by its PID.
    pub fn signal(&self, i: usize, signal: i32) -> BoxResult<()> {
        let pid = libc::pid_t::try_from(self.workers[i].pid)?;
        // SAFETY: kill(2) with a PID we started and have not reaped: the child handle
        // keeps it unreaped, so the PID cannot belong to another process.
        if unsafe { libc::kill(pid, signal) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(())
    }

    /// SIGKILLs every worker, waits for them, and returns every section reported.
    pub async fn stop(mut self) -> Vec<Section> {
        for worker in &mut self.workers {
            let _ = worker.child.start_kill();
        }
        for worker in &mut self.workers {
            let _ = tokio::time::timeout(Duration::from_secs(5), worker.child.wait()).await;
        }
        // Sections reported before the kill are still in the channel.
        while let Ok((_, event)) = self.events.try_recv() {
            if let Event::Section { section } = event {
                self.sections.push(section);
            }
        }
        self.sections
    }

    fn last_troubles(&self) -> String {
        let troubles: Vec<String> = self
            .troubles
            .iter()
            .enumerate()
            .filter_map(|(i, t)| Some(format!("{}: {}", client_name(i), t.as_ref()?)))
            .collect();
        if troubles.is_empty() {
            String::new()
        } else {
            format!(" (last troubles: {})", troubles.join("; "))
        }
    }
}

fn worker_argv(spec: &WorkerArgs) -> Vec<String> {
    let mut argv = vec![
        format!("--backend={}", spec.backend.flag()),
        format!("--endpoints={}", spec.endpoints.join(",")),
        format!("--postgres={}", spec.postgres),
        format!("--run={}", spec.run),
        format!("--client={}", spec.client),
        format!("--ttl={}ms", spec.ttl.as_millis()),
        format!("--hold={}ms", spec.hold.as_millis()),
    ];
    if spec.no_renewal {
        argv.push("--no-renewal".into());
    }
    argv.extend(spec.tls.to_args());
    argv
}
