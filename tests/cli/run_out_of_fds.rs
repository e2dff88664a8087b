//! `fencelock run` that cannot list its command's processes (out of file descriptors:
//! every look at the tree opens `/proc` files) while the command's leftovers run. A list
//! that cannot be read is no empty list: the lock is held until the tree can be walked
//! again, and what is found then is ended before the release. Injected: fencelock's
//! open-files limit is lowered to 0 from outside (`prlimit(2)`, as `prlimit --pid` does)
//! once its command has started a process in a session of its own (reachable only by
//! the walk). Before, fencelock took the failed reads for "no children" and released the
//! lock at once, the leftover running.

use std::time::Duration;

use fencelock::testkit::EtcdCluster;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::{fencelock_run, is_running, kill_all, next_line, spawn_piped};

/// Sets the soft open-files limit of process `pid` to 0, or back to `limit` (the hard
/// limit kept); returns the limit it replaced, `None` if the process is gone.
fn set_open_files(pid: u32, limit: Option<libc::rlimit>) -> Option<libc::rlimit> {
    let pid = libc::pid_t::try_from(pid).expect("pid");
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    let gone = || std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    // SAFETY: prlimit(2) reads into `old`, a live local.
    if unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, std::ptr::null(), &mut old) } != 0 {
        assert!(gone(), "prlimit: {}", std::io::Error::last_os_error());
        return None;
    }
    let new = limit.unwrap_or(libc::rlimit {
        rlim_cur: 0,
        rlim_max: old.rlim_max,
    });
    // SAFETY: as above; `new` is a live local.
    if unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &new, std::ptr::null_mut()) } != 0 {
        assert!(gone(), "prlimit: {}", std::io::Error::last_os_error());
        return None;
    }
    Some(old)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_that_cannot_be_listed_keeps_the_lock_until_it_can() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let dir = tempfile::tempdir().expect("tempdir");
    let terminated = dir.path().join("terminated");
    let mut command = fencelock_run(&etcd.endpoints(), "cli-out-of-fds");
    command
        .args(["--lock", "job", "--ttl", "3s", "--grace", "300ms", "--"])
        // A process in a session of its own (no group signal reaches it) that notes a
        // SIGTERM, then the shell waits for its input to end.
        .args([
            "sh",
            "-c",
            "setsid sh -c 'echo $$; trap \"echo > $0; exit 0\" TERM; \
             sleep 300 >/dev/null 2>&1 & wait' \"$0\" & read line || :",
        ])
        .arg(&terminated);
    let (mut fencelock, pid, mut lines) = spawn_piped(&mut command);
    let leftover: i32 = next_line(&mut lines).await.parse().expect("pid");
    let mut stderr = BufReader::new(fencelock.stderr.take().expect("stderr")).lines();

    let limit = set_open_files(pid, None).expect("fencelock runs");
    // The shell exits: fencelock looks for what it left.
    drop(fencelock.stdin.take());
    let warning = tokio::time::timeout(Duration::from_secs(10), async {
        let mut seen = String::new();
        loop {
            tokio::select! {
                line = stderr.next_line() => match line {
                    Ok(Some(line)) if line.contains("cannot list the children") => {
                        return Ok(line);
                    }
                    Ok(Some(line)) => {
                        seen.push_str(&line);
                        seen.push('\n');
                    }
                    _ => return Err(seen),
                },
                status = fencelock.wait() => {
                    seen.push_str(&format!("(fencelock exited: {status:?})"));
                    return Err(seen);
                }
            }
        }
    })
    .await
    .expect("fencelock warns or exits within 10 s");
    let held_while_running = fencelock.try_wait().expect("try_wait").is_none();
    let leftover_ran = is_running(leftover);
    // Held indeed: another client is refused (75: not granted within --wait).
    let other = fencelock_run(&etcd.endpoints(), "cli-out-of-fds")
        .args(["--lock", "job", "--wait", "200ms", "--", "true"])
        .status()
        .await
        .expect("another fencelock");
    set_open_files(pid, Some(limit));
    if let Err(stderr) = warning {
        kill_all(&[leftover]);
        panic!(
            "fencelock ended (and released the lock) without a word of the tree it could \
             not list; its leftover still ran: {leftover_ran}; stderr: {stderr}"
        );
    }
    assert!(
        leftover_ran,
        "the leftover was ended while unlisted: {warning:?}"
    );
    assert!(
        held_while_running,
        "fencelock ended while the tree was unknown"
    );
    assert_eq!(other.code(), Some(75), "another client took the lock");

    // Listable again: the leftover is found, ended after the grace, and only then is the
    // lock released.
    let status = tokio::time::timeout(Duration::from_secs(10), fencelock.wait())
        .await
        .expect("fencelock exits once it can look again")
        .expect("wait");
    let outlived = is_running(leftover);
    kill_all(&[leftover]);
    assert!(!outlived, "the leftover outlived the lock");
    assert_eq!(status.code(), Some(0), "the command's own status");
    assert!(
        terminated.exists(),
        "the leftover found once the lists could be read got SIGKILL without a SIGTERM"
    );
}
