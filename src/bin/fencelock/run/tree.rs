//! The processes `fencelock run` answers for: every descendant of `fencelock` (but its
//! watchdog), whatever process group or session it moved to.
//!
//! Everyday tools leave the command's process group: GNU `timeout` moves itself and its
//! child into a group of their own, `setsid` and daemons start a session, `sudo` may run
//! the command in a new session. `fencelock` is therefore a *child subreaper*
//! (`PR_SET_CHILD_SUBREAPER`): a process whose parent exits is handed to `fencelock`
//! instead of `init`, so every process the command ever started stays in `fencelock`'s
//! tree until it exits, and is found by walking `/proc/<pid>/task/<tid>/children` from
//! `fencelock` down. The walk reads the descendants only: its cost does not grow with the
//! other processes on the machine (a full `/proc` scan read every one of them between two
//! looks at the lease deadline).
//!
//! Signals go through a pidfd opened on a process whose start time was just read again,
//! so a pid reused by an unrelated process after its owner exited is never signalled.
//! Orphans handed to `fencelock` are reaped here once they exit ([`reap_orphans`]).

use std::collections::HashSet;
use std::io;

/// What `fencelock` needs to know of one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Process {
    pub pid: libc::pid_t,
    /// When it started (clock ticks since boot): with the pid, names one process for good.
    pub started: u64,
    /// Its process group.
    pub group: libc::pid_t,
    /// Some thread of it still runs (a process whose main thread exited shows as a zombie
    /// while its other threads work on).
    pub running: bool,
    /// Its `/proc` entry could be read. One that exists but cannot be read (`/proc`
    /// mounted `hidepid=`, a process of another user) counts as running, and as one the
    /// signals cannot reach: the lock is held until it exits.
    pub readable: bool,
}

/// Makes this process the reaper of its orphaned descendants.
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl with an integer argument; no memory is passed.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Checks that the kernel lists a thread's children in `/proc`
/// (`/proc/<pid>/task/<tid>/children`, `CONFIG_PROC_CHILDREN`): every look for the
/// command's processes walks those lists, and without them it would find none, ever, and
/// report the command's leftovers gone while they run (the lock released under them).
/// Some kernels leave it out (it is an option since Linux 4.2), as do some sandboxes'
/// emulated `/proc`.
pub fn check_children_listed() -> io::Result<()> {
    // SAFETY: gettid has no preconditions.
    let thread = unsafe { libc::gettid() };
    let list = format!("/proc/self/task/{thread}/children");
    std::fs::read_to_string(&list).map(|_| ()).map_err(|err| {
        io::Error::new(
            err.kind(),
            format!(
                "cannot read {list} ({err}): this kernel does not list a process's children \
                 (CONFIG_PROC_CHILDREN), so fencelock run could not find the processes a \
                 command leaves behind; not taking the lock"
            ),
        )
    })
}

/// Whether `child`, a child of this process not reaped yet, is found in the kernel's lists
/// of this process's children: [`check_children_listed`] proven on a real child (a list
/// that can be read but is empty, an emulated `/proc`, would pass the first check).
pub fn lists_child(child: libc::pid_t) -> bool {
    // SAFETY: getpid has no preconditions.
    children(unsafe { libc::getpid() }).is_ok_and(|listed| listed.contains(&child))
}

/// What a walk of the tree found: the processes, and whether every list of children on
/// the way could be read.
#[derive(Debug, Default)]
pub struct Descendants {
    pub processes: Vec<Process>,
    /// A process (the first met) whose children could not be listed, though it exists,
    /// and why (out of file descriptors, `EMFILE`; out of memory): what runs below it is
    /// unknown, and may be anything. Counted as something running, never as nothing.
    pub unlisted: Option<Unlisted>,
}

/// A process of the tree whose children could not be listed.
#[derive(Debug)]
pub struct Unlisted {
    pub pid: libc::pid_t,
    pub error: io::Error,
}

impl Descendants {
    /// Nothing is known to run, and every list could be read: the only state in which
    /// the tree may be taken for empty.
    pub fn is_empty(&self) -> bool {
        self.processes.is_empty() && self.unlisted.is_none()
    }
}

/// Every descendant of this process except the pids in `skip` (and their descendants).
pub fn descendants(skip: &[libc::pid_t]) -> Descendants {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    walk(me, skip, |pid| listed(pid, me), look)
}

/// [`children`] of `pid`, where the root, this process, is never gone: its entry not
/// found means a `/proc` of another pid namespace, whose lists say nothing of ours.
fn listed(pid: libc::pid_t, me: libc::pid_t) -> io::Result<Vec<libc::pid_t>> {
    match children_unless_gone(pid)? {
        Some(listed) => Ok(listed),
        None if pid == me => Err(io::Error::new(
            io::ErrorKind::NotFound,
            "this process's own /proc entry is missing (a /proc of another pid namespace?)",
        )),
        None => Ok(Vec::new()),
    }
}

/// What a look at one listed pid finds.
enum Look {
    Found(Stat, bool),
    /// Gone (and reaped) since its parent listed it.
    Gone,
    /// There, but its `/proc` entry cannot be read.
    Hidden,
}

/// Reads `pid`'s state; a pid whose `stat` cannot be read is asked whether it exists
/// (signal 0: anything but "no such process" means it does).
fn look(pid: libc::pid_t) -> Look {
    if let Some(stat) = Stat::read(pid) {
        let running = stat.running() || any_thread_running(pid);
        return Look::Found(stat, running);
    }
    unread(pid)
}

/// What a pid whose `stat` could not be read is: gone, or there and hidden.
fn unread(pid: libc::pid_t) -> Look {
    // SAFETY: kill(2) with signal 0 sends nothing; it only checks the pid.
    let checked = unsafe { libc::kill(pid, 0) };
    if checked != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        Look::Gone
    } else {
        Look::Hidden
    }
}

/// How many times [`walk`] reads the reapers again before it settles for what it found:
/// more than one pass is only needed while processes exit (or fork) during the walk.
const PASSES: usize = 4;

/// Every descendant of `root` but `skip`, the children of a process read by `read`.
///
/// A process whose parent exits *during* the walk is handed to its reaper (`root`, the
/// subreaper, or a subreaper among the descendants) after that reaper's children may have
/// been read, and its old parent lists it no more: one pass would miss it (and a command
/// whose middle process exits as the last walk ran would have its grandchild left running
/// after the lock is released). So once a pass is over, the children of `root` and of
/// every running process found are read again, and any unseen one is walked, until a pass
/// finds none new. A process found keeps the state it was first read in, so one that
/// exits meanwhile still counts as running: the walk errs towards "something runs". For
/// the same reason, a walk still finding new processes after its last pass counts them
/// as running unread, and a listed process whose state cannot be read but that exists
/// counts as running (see [`Process::readable`]), and a process whose children cannot be
/// listed though it exists makes the walk [`Descendants::unlisted`]: a failed read of a
/// list is never taken for an empty one (which released the lock under a command's
/// leftovers when fencelock ran out of file descriptors).
fn walk(
    root: libc::pid_t,
    skip: &[libc::pid_t],
    mut read: impl FnMut(libc::pid_t) -> io::Result<Vec<libc::pid_t>>,
    mut look: impl FnMut(libc::pid_t) -> Look,
) -> Descendants {
    let mut found = Vec::new();
    let mut seen = HashSet::new();
    let mut unlisted = None;
    let mut list = |pid: libc::pid_t, into: &mut Vec<libc::pid_t>| match read(pid) {
        Ok(children) => into.extend(children),
        Err(error) => {
            unlisted.get_or_insert(Unlisted { pid, error });
        }
    };
    let mut next = Vec::new();
    list(root, &mut next);
    for _ in 0..PASSES {
        while let Some(pid) = next.pop() {
            if skip.contains(&pid) || !seen.insert(pid) {
                continue;
            }
            match look(pid) {
                Look::Found(stat, running) => found.push(Process {
                    pid,
                    started: stat.started,
                    group: stat.group,
                    running,
                    readable: true,
                }),
                Look::Gone => continue,
                Look::Hidden => found.push(Process::unread(pid)),
            }
            list(pid, &mut next);
        }
        list(root, &mut next);
        for process in found.iter().filter(|p| p.running) {
            list(process.pid, &mut next);
        }
        next.retain(|pid| !skip.contains(pid) && !seen.contains(pid));
        if next.is_empty() {
            return Descendants {
                processes: found,
                unlisted,
            };
        }
    }
    // Not settled: what keeps turning up is real (listed by a process of the tree). It
    // is read, not walked further: a process read is signalled as any other.
    next.sort_unstable();
    next.dedup();
    for pid in next {
        match look(pid) {
            Look::Found(stat, running) => found.push(Process {
                pid,
                started: stat.started,
                group: stat.group,
                running,
                readable: true,
            }),
            Look::Gone => {}
            Look::Hidden => found.push(Process::unread(pid)),
        }
    }
    Descendants {
        processes: found,
        unlisted,
    }
}

impl Process {
    /// A process known to exist whose state was not read: running, unreachable.
    fn unread(pid: libc::pid_t) -> Self {
        Self {
            pid,
            started: 0,
            group: 0,
            running: true,
            readable: false,
        }
    }
}

/// Reaps the children of this process that have exited, but the ones in `keep` (waited
/// for by their own handles). Orphans handed to a subreaper become its zombies when they
/// exit: left unreaped by a long-running command that orphans processes all the time,
/// they would fill the process table.
pub fn reap_orphans(keep: &[libc::pid_t]) {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    // Unlisted, nothing is reaped this time; the next look tries again.
    for pid in children(me).unwrap_or_default() {
        // A child whose state cannot be read (hidepid, another user's) is tried too: a
        // zombie of another user left unreaped would count as running for ever, and
        // WNOHANG on a running child does nothing.
        if keep.contains(&pid) || Stat::read(pid).is_some_and(|stat| stat.running()) {
            continue;
        }
        let mut status = 0;
        // SAFETY: waitpid on a child of ours that has exited; WNOHANG never blocks (a
        // zombie whose other threads still run is not reaped yet: it returns 0).
        unsafe {
            libc::waitpid(pid, &mut status, libc::WNOHANG);
        }
    }
}

/// Sends `signal` to `process` if it is still the process that was found (same pid, same
/// start time); signal 0 only checks that it could be sent. Gone is not an error.
pub fn signal(process: &Process, signal: i32) -> io::Result<()> {
    if !process.readable {
        // Without its start time, a pid reused meanwhile could not be told apart.
        return Err(io::Error::other(
            "its /proc entry cannot be read (hidepid, or another user's)",
        ));
    }
    let pidfd = match PidFd::open(process.pid) {
        Ok(pidfd) => pidfd,
        Err(err) if err.raw_os_error() == Some(libc::ESRCH) => return Ok(()),
        Err(err) if err.raw_os_error() == Some(libc::ENOSYS) => {
            // Kernels before 5.3: the start time is checked, the kill follows at once.
            if still_the_same(process) {
                // SAFETY: kill(2) of a process of our tree, just checked.
                if unsafe { libc::kill(process.pid, signal) } != 0 {
                    return gone_is_fine(io::Error::last_os_error());
                }
            }
            return Ok(());
        }
        Err(err) => return Err(err),
    };
    // The pidfd refers to whatever process had the pid when it was opened: check that it
    // is the one found, and then it cannot change.
    if !still_the_same(process) {
        return Ok(());
    }
    pidfd.send(signal).or_else(gone_is_fine)
}

/// Whether `process`'s pid still names the process that was found.
fn still_the_same(process: &Process) -> bool {
    Stat::read(process.pid).is_some_and(|s| s.started == process.started)
}

fn gone_is_fine(err: io::Error) -> io::Result<()> {
    if err.raw_os_error() == Some(libc::ESRCH) {
        Ok(())
    } else {
        Err(err)
    }
}

/// A pidfd (Linux 5.3): a handle on one process, which a reused pid cannot redirect.
struct PidFd(libc::c_int);

impl PidFd {
    fn open(pid: libc::pid_t) -> io::Result<Self> {
        // SAFETY: pidfd_open(2) takes a pid and flags, and returns a new descriptor.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        libc::c_int::try_from(fd)
            .map(Self)
            .map_err(|_| io::Error::other("pidfd out of range"))
    }

    fn send(&self, signal: i32) -> io::Result<()> {
        // SAFETY: pidfd_send_signal(2) on our descriptor, no siginfo, no flags.
        let sent = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0,
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if sent != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for PidFd {
    fn drop(&mut self) {
        // SAFETY: closing the descriptor this handle owns.
        unsafe {
            libc::close(self.0);
        }
    }
}

/// The children of `pid`, over all its threads (a child belongs to the thread that forked
/// it, and an orphan handed to a subreaper to one of its threads). A process or thread
/// gone meanwhile lists none; any other failure (`EMFILE`, `ENOMEM`) is an error: its
/// children are unknown, not absent.
fn children(pid: libc::pid_t) -> io::Result<Vec<libc::pid_t>> {
    Ok(children_unless_gone(pid)?.unwrap_or_default())
}

/// [`children`], `None` if the process is gone.
fn children_unless_gone(pid: libc::pid_t) -> io::Result<Option<Vec<libc::pid_t>>> {
    let tasks = match std::fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(tasks) => tasks,
        Err(err) if gone(&err) => return Ok(None),
        Err(err) => return Err(err),
    };
    let mut all = Vec::new();
    for task in tasks {
        let mut path = match task {
            Ok(task) => task.path(),
            Err(err) if gone(&err) => continue,
            Err(err) => return Err(err),
        };
        path.push("children");
        match std::fs::read_to_string(path) {
            Ok(list) => all.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<libc::pid_t>().ok()),
            ),
            Err(err) if gone(&err) => {}
            Err(err) => return Err(err),
        }
    }
    Ok(Some(all))
}

/// Whether a failed read of a `/proc` entry says the process (or thread) is gone: no such
/// file (reaped), or no such process (exited while its entry was read).
fn gone(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::NotFound || err.raw_os_error() == Some(libc::ESRCH)
}

/// Whether any thread of `pid` runs (its main thread may have exited, leaving it a
/// zombie to `stat` while the others work on). A thread list or a thread's state that
/// cannot be read though it is there (`EMFILE`) counts as running, as in [`children`].
fn any_thread_running(pid: libc::pid_t) -> bool {
    let tasks = match std::fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(tasks) => tasks,
        Err(err) => return !gone(&err),
    };
    tasks.into_iter().any(|task| {
        let mut path = match task {
            Ok(task) => task.path(),
            Err(err) => return !gone(&err),
        };
        path.push("stat");
        match std::fs::read_to_string(path) {
            Ok(text) => Stat::parse(&text).is_some_and(|stat| stat.running()),
            Err(err) => !gone(&err),
        }
    })
}

/// The fields of `/proc/<pid>/stat` used here.
#[derive(Debug, PartialEq, Eq)]
struct Stat {
    state: char,
    group: libc::pid_t,
    started: u64,
}

impl Stat {
    fn read(pid: libc::pid_t) -> Option<Self> {
        Self::parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
    }

    fn parse(text: &str) -> Option<Self> {
        // The command name (in parentheses) may contain anything: parse after it.
        let (_, rest) = text.rsplit_once(')')?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // After the name: state (field 3), ppid (4), pgrp (5), ..., starttime (22).
        Some(Self {
            state: fields.first()?.chars().next()?,
            group: fields.get(2)?.parse().ok()?,
            started: fields.get(19)?.parse().ok()?,
        })
    }

    /// Not finished: a zombie (`Z`) or a dead task (`X`) has.
    fn running(&self) -> bool {
        !matches!(self.state, 'Z' | 'X')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_kernel_lists_children_and_a_child_is_found_in_the_list() {
        check_children_listed().expect("CONFIG_PROC_CHILDREN");
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .expect("spawn");
        let pid = libc::pid_t::try_from(child.id()).expect("pid");
        let listed = lists_child(pid);
        let _ = child.kill();
        let _ = child.wait();
        assert!(listed, "{pid} not among this process's children");
        assert!(!lists_child(1), "init is no child of ours");
    }

    #[test]
    fn stat_is_read_after_a_name_with_spaces_and_parentheses() {
        let line = "4242 (a) b (c)) S 17 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 \
                    987654 1000000 100 18446744073709551615";
        assert_eq!(
            Stat::parse(line),
            Some(Stat {
                state: 'S',
                group: 4242,
                started: 987_654,
            })
        );
        assert!(Stat::parse("4242 (cut").is_none());
    }

    /// A process whose parent exits during the walk, after the reaper's children were
    /// read: the kernel hands it to this (subreaper) process, and its old parent no
    /// longer lists it. The exit is placed in that window deterministically: the walk's
    /// reader kills the middle process, and waits until it has exited (and the
    /// grandchild been handed over), right after it has read the root's children.
    #[test]
    fn a_grandchild_whose_parent_exits_during_the_walk_is_found() {
        become_subreaper().expect("subreaper");
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        let mut sh = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .expect("sh");
        let middle = libc::pid_t::try_from(sh.id()).expect("pid");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let grandchild = loop {
            if let Some(&pid) = children(middle).unwrap_or_default().first() {
                break pid;
            }
            assert!(std::time::Instant::now() < deadline, "sh never forked");
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        let mut killed = false;
        let found = walk(
            me,
            &[],
            |pid| {
                let listed = children(pid);
                if pid == me && !killed {
                    killed = true;
                    // The wait returns once it has exited, after the kernel handed its
                    // child to us.
                    let _ = sh.kill();
                    let _ = sh.wait();
                }
                listed
            },
            look,
        );
        // Killed and reaped above (a second wait returns the status kept); also if the
        // walk never read the root.
        let _ = sh.kill();
        let _ = sh.wait();
        let grand = found
            .processes
            .iter()
            .find(|p| p.pid == grandchild)
            .copied();
        // SAFETY: the grandchild is ours now: kill and reap it.
        unsafe {
            libc::kill(grandchild, libc::SIGKILL);
            let mut status = 0;
            libc::waitpid(grandchild, &mut status, 0);
        }
        let grand = grand.expect("the grandchild handed over during the walk is found");
        assert!(grand.running);
    }

    /// `/proc` mounted `hidepid=2` (or a process of another user): a child of the tree is
    /// listed, but its `stat` cannot be read. It is there: it counts as running, and as
    /// one the signals cannot reach (so the lock is held until it exits).
    #[test]
    fn a_listed_process_whose_state_cannot_be_read_counts_as_running() {
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let pid = libc::pid_t::try_from(child.id()).expect("pid");
        let found = walk(me, &[], children, |listed| {
            if listed == pid {
                unread(listed)
            } else {
                look(listed)
            }
        });
        let hidden = found.processes.iter().find(|p| p.pid == pid).copied();
        assert!(
            signal(&hidden.unwrap_or(Process::unread(pid)), 0).is_err(),
            "an unread process is reported unreachable"
        );
        let _ = child.kill();
        let _ = child.wait();
        let hidden = hidden.expect("the hidden child is found");
        assert!(hidden.running && !hidden.readable);
        // Once it is gone, it is gone.
        assert!(matches!(unread(pid), Look::Gone));
    }

    /// Processes that keep turning up (a tree forking as fast as it is walked): what the
    /// last pass still finds new counts (read, as any other), instead of being left out.
    #[test]
    fn what_the_last_pass_still_finds_counts_as_running() {
        let root = 1_000_000;
        let mut root_reads = 0;
        let found = walk(
            root,
            &[],
            |pid| {
                if pid == root {
                    root_reads += 1;
                    Ok((1..=root_reads).map(|i| root + i).collect())
                } else {
                    Ok(Vec::new())
                }
            },
            |_| {
                let stat = Stat {
                    state: 'S',
                    group: 1,
                    started: 1,
                };
                Look::Found(stat, true)
            },
        );
        let newest = root + libc::pid_t::try_from(PASSES + 1).expect("small");
        let last = found
            .processes
            .iter()
            .find(|p| p.pid == newest)
            .expect("the newest found");
        assert!(
            last.running && last.readable,
            "read like any other: {last:?}"
        );
        assert_eq!(found.processes.len(), PASSES + 1);
        assert!(found.unlisted.is_none());
    }

    #[test]
    fn a_child_is_found_and_a_process_of_another_tree_is_not() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let pid = libc::pid_t::try_from(child.id()).expect("pid");
        let found = descendants(&[]);
        let _ = child.kill();
        let _ = child.wait();
        let sleep = found
            .processes
            .iter()
            .find(|p| p.pid == pid)
            .expect("the child");
        assert!(sleep.running);
        assert!(found.unlisted.is_none(), "{:?}", found.unlisted);
        // SAFETY: getppid has no preconditions.
        let parent = unsafe { libc::getppid() };
        assert!(found.processes.iter().all(|p| p.pid != parent));
        assert!(descendants(&[pid]).processes.iter().all(|p| p.pid != pid));
    }

    /// A list of children that cannot be read (out of file descriptors: `EMFILE`) is no
    /// empty list: the walk says so, whether it is the root's or a descendant's, and what
    /// it did find is kept.
    #[test]
    fn a_list_that_cannot_be_read_leaves_the_walk_unlisted_not_empty() {
        let root = 1_000_000;
        let stat = || Stat {
            state: 'S',
            group: 1,
            started: 1,
        };
        let emfile = || io::Error::from_raw_os_error(libc::EMFILE);
        let at_root = walk(root, &[], |_| Err(emfile()), |_| Look::Found(stat(), true));
        assert!(at_root.processes.is_empty());
        assert!(!at_root.is_empty(), "an unread root is not an empty tree");
        assert_eq!(at_root.unlisted.as_ref().map(|u| u.pid), Some(root));

        let below = walk(
            root,
            &[],
            |pid| {
                if pid == root {
                    Ok(vec![root + 1])
                } else {
                    Err(emfile())
                }
            },
            |_| Look::Found(stat(), true),
        );
        assert_eq!(below.processes.len(), 1);
        let unlisted = below.unlisted.expect("the child's list failed");
        assert_eq!(unlisted.pid, root + 1);
        assert_eq!(unlisted.error.raw_os_error(), Some(libc::EMFILE));

        // A process gone meanwhile lists no children, and that is no error; but the root
        // (this process) is never gone: its entry missing is a /proc of another pid
        // namespace.
        assert!(children(libc::pid_t::MAX).is_ok_and(|listed| listed.is_empty()));
        assert!(listed(libc::pid_t::MAX, 1).is_ok_and(|listed| listed.is_empty()));
        assert!(listed(libc::pid_t::MAX, libc::pid_t::MAX).is_err());
    }
}
