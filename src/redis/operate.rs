//! For operators: breaking a stuck holder of a Redis lock.
//!
//! Redis keeps no token with a lock's key (the token is a counter beside it, drawn in the
//! same round trip as the `SET NX`; keeping it with the key would make every acquisition
//! a script, which costs the server several times the two commands): a holder is named by
//! its owner value ([`RedisGuard::owner`](super::RedisGuard::owner), shown by
//! [`inspect`](RedisLocker::inspect)), and breaking it is the release's own
//! compare-and-delete on that value, which then wakes the waiters.

use super::keys::LockKeys;
use super::locker::RedisLocker;
use super::script_call::ScriptCall;
use super::scripts;
use crate::{LockError, validate_name};

impl RedisLocker {
    /// Ends the holder of lock `name` (or of a permit of the semaphore `name`) whose owner
    /// value is `owner`: deletes its key only while it still holds that value, so that a
    /// holder granted in between is never touched, and announces the release to the
    /// waiters. `true` if it deleted; `false` if no holder has that owner any more. The
    /// broken holder learns it at its next renewal (at most a third of its TTL later; the
    /// Redis lock has no watch on its own key); its token is below the next holder's, so
    /// fenced storage refuses its late writes.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: one script call, applied or not.
    #[tracing::instrument(skip(self), fields(backend = "redis"))]
    pub async fn break_holder(&self, name: &str, owner: &str) -> Result<bool, LockError> {
        validate_name(name)?;
        let Some(holder) = self
            .inspect(name)
            .await?
            .into_iter()
            .flat_map(|state| state.holders)
            .find(|holder| holder.owner == owner)
        else {
            return Ok(false);
        };
        self.compare_and_delete(name, &holder.key, &holder.value)
            .await
    }

    /// Ends every holder of lock `name` and of the semaphore `name` (waiters leave no
    /// trace on Redis: they are woken, and wait on): each is compare-and-deleted on the
    /// value it was read with (the whole value: one `fencelock` does not recognise is
    /// broken too). Returns how many it deleted.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: each delete is one script call; a dropped call leaves the rest.
    #[tracing::instrument(skip(self), fields(backend = "redis"))]
    pub async fn break_all(&self, name: &str) -> Result<usize, LockError> {
        validate_name(name)?;
        let mut deleted = 0;
        for holder in self
            .inspect(name)
            .await?
            .into_iter()
            .flat_map(|state| state.holders)
        {
            if self
                .compare_and_delete(name, &holder.key, &holder.value)
                .await?
            {
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    async fn compare_and_delete(
        &self,
        name: &str,
        key: &str,
        value: &[u8],
    ) -> Result<bool, LockError> {
        let keys = LockKeys::new(self.prefix(), name);
        let node = &self.core().nodes[0];
        let mut conn = node.connection();
        // The whole value as it was read, not the owner parsed out of it: exactly the
        // holder shown is ended, whatever its value holds.
        let mut call = ScriptCall::new(&scripts::BREAK, &[key], 2);
        call.arg(value).arg(keys.channel());
        let deleted: i64 = node
            .call("break", Some(name), call.invoke(&mut conn))
            .await?;
        Ok(deleted == 1)
    }
}
