//! The failure scenarios S1-S8 (the guide's `docs/chaos.md`): for each, the workers it runs and the faults
//! it injects, driven by what the workers report (a fault aims at a holder *at work*, the
//! next step waits for the grant or section that proves the previous one took effect).

use std::time::Duration;

use clap::ValueEnum;
use fencelock::testkit::{FaultProxy, compact_now};
use serde::Serialize;

use super::checker::{Section, Verdict, Write};
use super::events::Event;
use super::fleet::{Fleet, client_name};
use super::monotonic::now_ns;
use super::stage::{Stage, Topology};
use super::worker::ChaosBackend;
use crate::bench::BoxResult;

/// A failure scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, ValueEnum, Serialize)]
pub enum Scenario {
    /// Holder killed with SIGKILL.
    S1,
    /// Holder paused (SIGSTOP) past its TTL, then resumed.
    S2,
    /// Sections longer than the TTL without renewal: the naive release deletes the next
    /// owner's lock.
    S3,
    /// etcd leader / Redis master killed while a lock is held.
    S4,
    /// Clock jump on one Redlock node.
    S5,
    /// Holder cut off from the lock service.
    S6,
    /// Redis token counter lost on failover.
    S7,
    /// etcd compaction while waiters wait.
    S8,
}

/// How a scenario runs for one backend.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub workers: usize,
    pub ttl: Duration,
    pub hold: Duration,
    pub renewal: bool,
    pub topology: Topology,
    /// Each worker reaches the lock service through its own fault proxy.
    pub proxied: bool,
}

/// What a staged run found beyond the checker's counts.
#[derive(Debug, Default)]
pub struct Finding {
    pub note: String,
    /// Whether the scenario-specific observation matched the expectation.
    pub ok: bool,
}

const TTL: Duration = Duration::from_secs(1);

impl Scenario {
    /// Every scenario, in order.
    pub const ALL: [Scenario; 8] = [
        Self::S1,
        Self::S2,
        Self::S3,
        Self::S4,
        Self::S5,
        Self::S6,
        Self::S7,
        Self::S8,
    ];

    /// One line on what it does.
    pub fn title(self) -> &'static str {
        match self {
            Self::S1 => "holder SIGKILLed",
            Self::S2 => "holder paused past its TTL",
            Self::S3 => "sections outlive the TTL (no renewal)",
            Self::S4 => "leader/master SIGKILLed while held",
            Self::S5 => "clock jump on one Redlock node",
            Self::S6 => "holder cut off from the lock service",
            Self::S7 => "Redis token counter lost on failover",
            Self::S8 => "etcd compaction while waiters wait",
        }
    }

    /// The backends it applies to, among `selected`.
    pub fn backends(self, selected: &[ChaosBackend]) -> Vec<ChaosBackend> {
        use ChaosBackend::{Etcd, Naive, Redis, Redlock, Zookeeper};
        let applicable: &[ChaosBackend] = match self {
            Self::S1 | Self::S2 | Self::S6 => &[Etcd, Redis, Redlock, Zookeeper],
            Self::S3 => &[Etcd, Redis, Redlock, Naive, Zookeeper],
            Self::S4 => &[Etcd, Redis, Zookeeper],
            Self::S5 => &[Redlock],
            Self::S7 => &[Redis],
            Self::S8 => &[Etcd],
        };
        applicable
            .iter()
            .copied()
            // The naive baseline comes with Redis.
            .filter(|b| selected.contains(b) || (*b == Naive && selected.contains(&Redis)))
            .collect()
    }

    /// Workers, TTL and section length for `backend`.
    pub fn plan(self, backend: ChaosBackend) -> Plan {
        let plan = Plan {
            workers: 3,
            ttl: TTL,
            hold: Duration::from_millis(100),
            renewal: true,
            topology: Topology::Any,
            proxied: false,
        };
        match self {
            Self::S1 | Self::S2 => plan,
            // Sections half again as long as the TTL, nothing renews it.
            Self::S3 => Plan {
                hold: TTL * 3 / 2,
                renewal: false,
                ..plan
            },
            Self::S4 | Self::S7 if backend == ChaosBackend::Etcd => Plan {
                topology: Topology::EtcdCluster,
                ..plan
            },
            Self::S4 if backend == ChaosBackend::Zookeeper => Plan {
                topology: Topology::ZooKeeperEnsemble,
                ..plan
            },
            // Long sections, so that the holder is still at work when a waiter reaches
            // the promoted replica.
            Self::S4 | Self::S7 => Plan {
                hold: TTL * 3 / 2,
                topology: Topology::RedisWithReplica,
                ..plan
            },
            Self::S5 => Plan {
                workers: 2,
                hold: TTL * 3 / 2,
                topology: Topology::RedlockWithClock,
                ..plan
            },
            // The holder is cut off for longer than the TTL while it works.
            Self::S6 => Plan {
                workers: 2,
                hold: TTL * 5 / 2,
                proxied: true,
                ..plan
            },
            Self::S8 => Plan { workers: 4, ..plan },
        }
    }

    /// What the design expects, in a few words.
    pub fn expected(self, backend: ChaosBackend) -> &'static str {
        match (self, backend) {
            (Self::S1, _) => "lock free after the TTL; grants in token order",
            (Self::S2, _) => "paused holder's fenced write rejected; unfenced updates lost",
            (Self::S3, ChaosBackend::Naive) => "deletes the next owner's lock (reproduced)",
            (Self::S3, _) => "never deletes another owner's lock",
            (Self::S4, ChaosBackend::Etcd) => "no second holder; tokens keep increasing",
            (Self::S4, ChaosBackend::Zookeeper) => {
                "no second holder, or (election longer than the session) the holder's guard \
                 reports lost before the next grant and its write is rejected; tokens keep \
                 increasing"
            }
            (Self::S4, _) => "a second holder appears (reproduced)",
            (Self::S5, _) => "two holders at once (reproduced)",
            (Self::S6, _) => "guard reports lost before the next grant; write rejected",
            (Self::S7, _) => "tokens repeat; the strict fence refuses them",
            (Self::S8, _) => "waiters still acquire, in token order",
        }
    }

    /// Whether the run matched [`expected`](Self::expected).
    pub fn met(
        self,
        backend: ChaosBackend,
        verdict: &Verdict,
        lost: LostUpdates,
        finding: &Finding,
    ) -> bool {
        let fenced_safe = verdict.stale_accepted == 0 && lost.fenced == 0;
        let orderly = verdict.overlapping == 0 && verdict.token_inversions == 0;
        match (self, backend) {
            (Self::S1 | Self::S8, _) => fenced_safe && orderly,
            (Self::S2, _) => fenced_safe && lost.unfenced > 0 && finding.ok,
            (Self::S3, ChaosBackend::Naive) => verdict.foreign_deletes > 0,
            (Self::S3, _) => fenced_safe && verdict.foreign_deletes == 0,
            (Self::S4, ChaosBackend::Etcd) => fenced_safe && orderly,
            // The overlap, if any, is the holder's own: `held_through_election` checks it.
            (Self::S4, ChaosBackend::Zookeeper) => {
                fenced_safe && verdict.token_inversions == 0 && finding.ok
            }
            (Self::S4 | Self::S5, _) => verdict.overlapping > 0,
            (Self::S6, _) => fenced_safe && finding.ok,
            (Self::S7, _) => verdict.token_inversions > 0 && verdict.stale_accepted == 0,
        }
    }

    /// Injects the faults and waits for their effects.
    pub async fn stage(
        self,
        backend: ChaosBackend,
        fleet: &mut Fleet,
        stage: &mut Stage,
        proxies: &[Vec<FaultProxy>],
    ) -> BoxResult<Finding> {
        match self {
            Self::S1 => holder_killed(fleet).await,
            Self::S2 => holder_paused(fleet).await,
            Self::S3 => fleet.sections_more(5).await.map(|()| Finding {
                note: "every section outlives the TTL".into(),
                ok: true,
            }),
            Self::S4 | Self::S7 if backend == ChaosBackend::Etcd => {
                leader_killed(fleet, stage).await
            }
            Self::S4 if backend == ChaosBackend::Zookeeper => {
                zookeeper_leader_killed(fleet, stage).await
            }
            Self::S4 | Self::S7 => master_failover(fleet, stage).await,
            Self::S5 => clock_jump(fleet, stage).await,
            Self::S6 => holder_cut_off(fleet, proxies).await,
            Self::S8 => compaction(fleet, stage).await,
        }
    }
}

/// Updates missing from the counters: sections that wrote minus what the counter shows.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct LostUpdates {
    pub fenced: i64,
    pub unfenced: i64,
}

impl LostUpdates {
    /// From the sections' own account and the counters' final values. A worker killed
    /// between its write and its report makes the counter larger than the account; that
    /// only hides losses, it never invents one.
    pub fn count(sections: &[Section], fenced: i64, unfenced: i64) -> Self {
        let accepted = sections
            .iter()
            .filter(|s| matches!(s.write, Write::Accepted { .. }))
            .count();
        let written = sections.iter().filter(|s| s.unfenced_written).count();
        Self {
            fenced: (i64::try_from(accepted).unwrap_or(i64::MAX) - fenced).max(0),
            unfenced: (i64::try_from(written).unwrap_or(i64::MAX) - unfenced).max(0),
        }
    }
}

fn ms(from_ns: u64, to_ns: u64) -> u64 {
    to_ns.saturating_sub(from_ns) / 1_000_000
}

/// S1: SIGKILL a holder at work; the next grant comes when its lease runs out.
async fn holder_killed(fleet: &mut Fleet) -> BoxResult<Finding> {
    fleet.sections_more(2).await?;
    let (victim, token) = fleet.at_work(|_| true).await?;
    let killed_ns = now_ns();
    fleet.signal(victim, libc::SIGKILL)?;
    let (_, next_token, granted_ns) = fleet.grant(|i| i != victim).await?;
    fleet.sections_more(3).await?;
    Ok(Finding {
        note: format!(
            "{} killed holding token {token}; next grant (token {next_token}) {} ms later",
            client_name(victim),
            ms(killed_ns, granted_ns)
        ),
        ok: true,
    })
}

/// S2: SIGSTOP a holder at work until another client has held the lock and written,
/// then SIGCONT it: it writes with its old token.
async fn holder_paused(fleet: &mut Fleet) -> BoxResult<Finding> {
    fleet.sections_more(2).await?;
    let (victim, token) = fleet.at_work(|_| true).await?;
    let paused_ns = now_ns();
    fleet.signal(victim, libc::SIGSTOP)?;
    let waited = fleet
        .wait_for("another holder's accepted write", |i, e| {
            i != victim
                && matches!(e, Event::Section { section }
                    if matches!(section.write, Write::Accepted { .. }))
        })
        .await;
    // Resume it whatever happened, so that it can report.
    fleet.signal(victim, libc::SIGCONT)?;
    waited?;
    let resumed_ns = now_ns();
    let section = fleet.section_of(victim).await?;
    fleet.sections_more(2).await?;
    let rejected = section.write == Write::Rejected;
    Ok(Finding {
        note: format!(
            "{} paused {} ms holding token {token}: fenced write {}, guard {}",
            client_name(victim),
            ms(paused_ns, resumed_ns),
            describe(section.write),
            if section.lost_ns.is_some() {
                "reported lost"
            } else {
                "never reported lost"
            },
        ),
        ok: rejected && section.lost_ns.is_some(),
    })
}

/// S4 (etcd): SIGKILL the leader of the 3-member cluster while a lock is held; restart
/// it after a few more sections.
async fn leader_killed(fleet: &mut Fleet, stage: &mut Stage) -> BoxResult<Finding> {
    let cluster = stage.etcd.as_mut().ok_or("no local etcd cluster")?;
    fleet.sections_more(2).await?;
    let (holder, token) = fleet.at_work(|_| true).await?;
    let leader = cluster.leader().await?;
    cluster.kill(leader)?;
    fleet.sections_more(4).await?;
    cluster.restart(leader).await?;
    fleet.sections_more(2).await?;
    Ok(Finding {
        note: format!(
            "leader m{leader} killed while {} held token {token}",
            client_name(holder)
        ),
        ok: true,
    })
}

/// S4 (ZooKeeper): SIGKILL the leader of the 3-member ensemble while a lock is held;
/// restart it after a few more sections.
async fn zookeeper_leader_killed(fleet: &mut Fleet, stage: &mut Stage) -> BoxResult<Finding> {
    let ensemble = stage
        .zookeeper
        .as_mut()
        .ok_or("no local ZooKeeper ensemble")?;
    fleet.sections_more(2).await?;
    let (holder, token) = fleet.at_work(|_| true).await?;
    let leader = ensemble.leader().await?;
    ensemble.kill(leader)?;
    fleet.sections_more(4).await?;
    ensemble.restart(leader).await?;
    fleet.sections_more(2).await?;
    let (ok, outcome) = held_through_election(&fleet.sections, &client_name(holder), token);
    Ok(Finding {
        note: format!(
            "leader member {leader} killed while {} held token {token}: {outcome}",
            client_name(holder)
        ),
        ok,
    })
}

/// What became of the holder's section (`client`, `token`) across a ZooKeeper leader
/// election: `(as expected, description)`. Either it held until its release, no other
/// section beginning inside it; or its session's local deadline passed while the ensemble
/// had no leader (the election outlasted the session timeout: on a loaded 2-core machine
/// with the chaos runs' 1 s sessions it does), and then its guard must have reported the
/// loss before any other section began and its fenced write must not have been accepted.
/// Unlike etcd, whose new leader renews every lease, a ZooKeeper client cannot know that
/// the new leader restarted its session's timeout, so it gives the lock up on its own
/// deadline: safe, and a second holder follows.
fn held_through_election(sections: &[Section], client: &str, token: u64) -> (bool, String) {
    let Some(held) = sections
        .iter()
        .find(|s| s.client == client && s.token == token)
    else {
        return (false, "its section was never reported".into());
    };
    let next_start = sections
        .iter()
        .filter(|s| s.token != token && s.start_ns > held.start_ns)
        .map(|s| s.start_ns)
        .min();
    match (held.lost_ns, next_start) {
        (None, Some(next)) if next < held.end_ns => (
            false,
            "another section began inside its own, and its guard never reported a loss".into(),
        ),
        (None, _) => (true, "held it until its release".into()),
        (Some(lost), next) => {
            let before_next = next.is_none_or(|next| lost <= next);
            let write_refused = !matches!(held.write, Write::Accepted { .. });
            (
                before_next && write_refused,
                format!(
                    "its session's local deadline passed during the election: guard reported \
                     lost {}; fenced write {}",
                    next.map_or("(no later grant)".into(), |next| format!(
                        "{} ms before the next grant",
                        i128::from(next / 1_000_000) - i128::from(lost / 1_000_000)
                    )),
                    describe(held.write)
                ),
            )
        }
    }
}

/// S4 and S7 (Redis): replication to the replica breaks (the writes it misses are the
/// ones asynchronous replication loses), the master dies while a lock is held, the replica
/// is promoted; the workers move to it as a Sentinel-aware client would.
async fn master_failover(fleet: &mut Fleet, stage: &mut Stage) -> BoxResult<Finding> {
    if stage.redis.len() < 2 {
        return Err("no local master and replica".into());
    }
    fleet.sections_more(1).await?;
    stage.redis[1].break_replication().await?;
    fleet.sections_more(2).await?;
    let (holder, token) = fleet.at_work(|_| true).await?;
    stage.redis[0].kill()?;
    stage.redis[1].promote().await?;
    let (other, other_token, _) = fleet.grant(|i| i != holder).await?;
    let section = fleet.section_of(holder).await?;
    fleet.sections_more(2).await?;
    Ok(Finding {
        note: format!(
            "{} held token {token} on the dead master; {} got token {other_token} from the \
             promoted replica while it worked (its write: {})",
            client_name(holder),
            client_name(other),
            describe(section.write)
        ),
        ok: true,
    })
}

/// S5: the third master is down while a client locks (it gets 2 of 3: a valid grant),
/// comes back empty, and the second master's clock jumps an hour ahead: the holder's key
/// expires there, and another client gets the second and third.
async fn clock_jump(fleet: &mut Fleet, stage: &mut Stage) -> BoxResult<Finding> {
    if stage.redis.len() < 3 || stage.clock.is_none() {
        return Err("no local Redlock masters with a jumping clock".into());
    }
    fleet.sections_more(1).await?;
    stage.redis[2].kill()?;
    // The next grant is made while the third master is down.
    let (holder, _, _) = fleet.grant(|_| true).await?;
    let (_, token) = fleet.at_work(|i| i == holder).await?;
    if let Some(clock) = &stage.clock {
        clock.jump_forward(Duration::from_secs(3600))?;
    }
    stage.redis[2].restart().await?;
    let (other, other_token, _) = fleet.grant(|i| i != holder).await?;
    fleet.section_of(holder).await?;
    fleet.sections_more(1).await?;
    Ok(Finding {
        note: format!(
            "{} held token {token} on masters 1-2; master 2's clock jumped 1 h; {} got \
             token {other_token} from masters 2-3",
            client_name(holder),
            client_name(other)
        ),
        ok: true,
    })
}

/// S6: freeze a holder's traffic to the lock service (its storage still works) for
/// longer than the TTL while it works.
async fn holder_cut_off(fleet: &mut Fleet, proxies: &[Vec<FaultProxy>]) -> BoxResult<Finding> {
    fleet.sections_more(1).await?;
    let (victim, token) = fleet.at_work(|_| true).await?;
    let cut_ns = now_ns();
    for proxy in &proxies[victim] {
        proxy.pause();
    }
    let outcome = async {
        let (_, _, granted_ns) = fleet.grant(|i| i != victim).await?;
        let section = fleet.section_of(victim).await?;
        BoxResult::Ok((granted_ns, section))
    }
    .await;
    for proxy in &proxies[victim] {
        proxy.resume();
    }
    let (granted_ns, section) = outcome?;
    fleet.sections_more(1).await?;
    let lost = match section.lost_ns {
        Some(lost_ns) => format!(
            "guard reported lost {} ms after the cut, {} ms before the next grant",
            ms(cut_ns, lost_ns),
            i128::from(granted_ns / 1_000_000) - i128::from(lost_ns / 1_000_000)
        ),
        None => "guard never reported lost".into(),
    };
    Ok(Finding {
        note: format!(
            "{} cut off holding token {token}: {lost}; fenced write {}",
            client_name(victim),
            describe(section.write)
        ),
        ok: section.lost_ns.is_some_and(|l| l <= granted_ns) && section.write == Write::Rejected,
    })
}

/// S8: compact the keyspace at every grant, while the other workers wait on watches that
/// started at older revisions.
async fn compaction(fleet: &mut Fleet, stage: &mut Stage) -> BoxResult<Finding> {
    // The workers' own connection settings (TLS, credentials), for the compactions.
    let config =
        fencelock::etcd::EtcdConfig::new(stage.endpoints.clone()).with_namespace("fencelock-chaos");
    let locks = fencelock::etcd::EtcdLocker::connect(stage.tls.etcd(config)?).await?;
    let mut client = locks.client().clone();
    let mut revisions = Vec::new();
    for _ in 0..6 {
        fleet.grant(|_| true).await?;
        revisions.push(compact_now(&mut client).await?);
    }
    fleet.sections_more(3).await?;
    Ok(Finding {
        note: format!(
            "{} compactions (revisions {}..{}) while 3 clients waited",
            revisions.len(),
            revisions.first().unwrap_or(&0),
            revisions.last().unwrap_or(&0)
        ),
        ok: true,
    })
}

fn describe(write: Write) -> &'static str {
    match write {
        Write::Accepted { .. } => "accepted",
        Write::Rejected => "rejected",
        Write::Failed => "failed",
    }
}
