//! The naive Redis lock of the article's first section, kept only as the baseline of
//! scenario S3: `SET NX PX`, no renewal, and a release that deletes the key without
//! asking whose it is. Never use it; it exists to show what the real backends prevent.

use std::time::Duration;

use fencelock::FencingToken;
use redis::aio::ConnectionManager;
use tokio::time::Instant;

use super::checker::Release;

/// The naive lock on one Redis server.
pub struct NaiveLocker {
    connection: ConnectionManager,
}

/// A naive grant: it never learns that it expired.
pub struct NaiveGuard {
    connection: ConnectionManager,
    key: String,
    owner: String,
    token: FencingToken,
}

impl NaiveLocker {
    /// Connects as `config` says (TLS included), over the lock client's connection.
    pub async fn connect(
        config: fencelock::redis::RedisConfig,
    ) -> Result<Self, fencelock::LockError> {
        let locks = fencelock::redis::RedisLocker::connect(config).await?;
        Ok(Self {
            connection: locks.connection(),
        })
    }

    /// Polls `SET NX PX` every 10 ms until it succeeds or `wait` runs out; the token is
    /// an `INCR` made after the grant.
    pub async fn lock(
        &self,
        name: &str,
        ttl: Duration,
        wait: Duration,
    ) -> redis::RedisResult<Option<NaiveGuard>> {
        let key = format!("naive:{name}");
        let owner = format!("{:016x}", rand_u64());
        let deadline = Instant::now() + wait;
        let mut connection = self.connection.clone();
        loop {
            let granted: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg(&owner)
                .arg("NX")
                .arg("PX")
                .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
                .query_async(&mut connection)
                .await?;
            if granted.is_some() {
                let token: u64 = redis::cmd("INCR")
                    .arg(format!("{key}:token"))
                    .query_async(&mut connection)
                    .await?;
                return Ok(Some(NaiveGuard {
                    connection,
                    key,
                    owner,
                    token: FencingToken::new(token),
                }));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl NaiveGuard {
    /// The grant's token.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The naive release: `DEL`, whoever holds the key. The script only reports what it
    /// deleted so the run can count the damage; it deletes regardless.
    pub async fn release(mut self) -> Release {
        let deleted: redis::RedisResult<Option<String>> = redis::Script::new(
            "local v = redis.call('GET', KEYS[1]); redis.call('DEL', KEYS[1]); return v",
        )
        .key(&self.key)
        .invoke_async(&mut self.connection)
        .await;
        match deleted {
            Ok(Some(owner)) if owner == self.owner => Release::Released,
            Ok(Some(_)) => Release::DeletedOther,
            Ok(None) => Release::NotHeld,
            Err(_) => Release::Failed,
        }
    }
}

fn rand_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // An owner value only has to differ between clients; fall back to the clock.
    if getrandom::fill(&mut bytes).is_err() {
        return super::monotonic::now_ns();
    }
    u64::from_le_bytes(bytes)
}
