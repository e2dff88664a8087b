//! The first lines of a run's output: what it compares, on which servers, how long it
//! will take and where its report goes; and where the report goes by default.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::BenchArgs;
use super::plan::{self, Plan, Scope, Server};

/// The header, before anything starts (`go_peer`: Go and etcd's Go sources are installed,
/// so the Go rows are expected; `report`: where the report will be written).
pub fn header(args: &BenchArgs, plan: &Plan, go_peer: bool, report: Option<&Path>) -> String {
    let mut out = String::new();
    let go_build = go_build_estimate();
    let estimate = plan.estimate(go_peer, go_build);
    let _ = match plan.scope {
        Scope::Quick => {
            let full = Plan::resolve(Scope::Full, args).estimate(go_peer, go_build);
            writeln!(
                out,
                "fencelock bench: the headline rows (--full runs every cell and bar, about {})",
                plan::minutes(full)
            )
        }
        Scope::Full => writeln!(out, "fencelock bench --full: every cell and bar"),
    };
    let _ = writeln!(out, "compared, each ratio inside this run:");
    for line in plan.compared(go_peer) {
        let _ = writeln!(out, "  {line}");
    }
    let _ = writeln!(out, "servers: {}", servers(args, plan));
    let steps = plan.steps(go_peer);
    let mut parts = vec![format!(
        "{} cells of {}",
        steps.timed_cells(),
        humantime::format_duration(plan.duration)
    )];
    if steps.renewals > 0 {
        parts.push(format!(
            "{} renewal row{}",
            steps.renewals,
            if steps.renewals == 1 { "" } else { "s" }
        ));
    }
    parts.push("the servers' start".into());
    if go_peer {
        parts.push("the Go peer's build".into());
    }
    let _ = writeln!(
        out,
        "estimated time: about {} ({}; longer on a busy machine)",
        plan::minutes(estimate),
        parts.join(", ")
    );
    if let Some(dir) = report {
        let _ = writeln!(
            out,
            "report, at the end: {}",
            dir.join("report.html").display()
        );
    }
    let _ = writeln!(out);
    out
}

/// `local (started by this run, loopback): etcd (fsync off), redis-server; given: ...`.
fn servers(args: &BenchArgs, plan: &Plan) -> String {
    let endpoints = &args.endpoints;
    let mut local = Vec::new();
    let mut given = Vec::new();
    let mut first_etcd = true;
    for server in plan.servers() {
        let name = server.describe(args.fsync);
        let address = match server {
            // The first etcd is the one `--etcd` replaces; the side clusters are local.
            Server::Etcd { .. } if first_etcd => {
                first_etcd = false;
                endpoints.etcd.as_ref().map(|e| e.join(","))
            }
            Server::Redis => endpoints.redis.clone(),
            Server::RedlockMasters => endpoints.redlock.as_ref().map(|e| e.join(",")),
            Server::ZooKeeper { members: 1 } => endpoints.zookeeper.clone(),
            // Connection strings carry passwords: named, not printed (an empty address).
            Server::Postgres => endpoints.postgres.as_ref().map(|_| String::new()),
            Server::MariaDb => args.mariadb.as_ref().map(|_| String::new()),
            _ => None,
        };
        match address {
            Some(address) if address.is_empty() => given.push(name),
            Some(address) => given.push(format!("{name} at {}", redact(&address))),
            None => local.push(name),
        }
    }
    let mut parts = Vec::new();
    if !local.is_empty() {
        parts.push(format!(
            "local, started by this run on loopback ports: {}",
            local.join(", ")
        ));
    }
    if !given.is_empty() {
        parts.push(format!("given: {}", given.join(", ")));
    }
    parts.join("; ")
}

/// A URL without its user and password (`redis://:secret@host` -> `redis://host`).
fn redact(address: &str) -> String {
    address
        .split(',')
        .map(|url| match (url.find("://"), url.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                format!("{}{}", &url[..scheme + 3], &url[at + 1..])
            }
            _ => url.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The Go peer's build: shorter when its cache outlives runs (`FENCELOCK_GO_CACHE`, as
/// in CI) and is there already.
fn go_build_estimate() -> std::time::Duration {
    match std::env::var_os("FENCELOCK_GO_CACHE") {
        Some(cache) if Path::new(&cache).is_dir() => plan::GO_BUILD_WARM,
        _ => plan::GO_BUILD_COLD,
    }
}

/// Where the report goes without `--report`: `fencelock-bench` in the cargo target dir
/// this binary was built into (`cargo run`'s `target/release/fencelock` -> `target/`,
/// whatever `CARGO_TARGET_DIR` says), else `target/fencelock-bench` under the current
/// directory.
pub fn default_report_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| target_dir_of(&exe, |dir| dir.join("CACHEDIR.TAG").is_file()))
        .map_or_else(
            || PathBuf::from("target").join("fencelock-bench"),
            |target| target.join("fencelock-bench"),
        )
}

/// The cargo target dir holding `exe` (`<target>/<profile>/<exe>`, the target dir marked
/// by the `CACHEDIR.TAG` cargo writes into it: `is_target`), if it is in one.
fn target_dir_of(exe: &Path, is_target: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    let target = exe.parent()?.parent()?;
    is_target(target).then(|| target.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::{redact, target_dir_of};
    use std::path::{Path, PathBuf};

    #[test]
    fn the_report_goes_into_the_target_dir_the_binary_runs_from() {
        let exe = Path::new("/src/fencelock/target/release/fencelock");
        assert_eq!(
            target_dir_of(exe, |dir| dir == Path::new("/src/fencelock/target")),
            Some(PathBuf::from("/src/fencelock/target"))
        );
        // An installed binary (~/.cargo/bin): no target dir, the caller's fallback.
        let installed = Path::new("/home/u/.cargo/bin/fencelock");
        assert_eq!(target_dir_of(installed, |_| false), None);
        assert_eq!(target_dir_of(Path::new("fencelock"), |_| true), None);
    }

    #[test]
    fn given_addresses_lose_their_credentials() {
        assert_eq!(
            redact("redis://:secret@127.0.0.1:6379/"),
            "redis://127.0.0.1:6379/"
        );
        assert_eq!(
            redact("http://a:2379,https://user:pw@b:2379"),
            "http://a:2379,https://b:2379"
        );
        assert_eq!(redact("127.0.0.1:2181"), "127.0.0.1:2181");
    }
}
