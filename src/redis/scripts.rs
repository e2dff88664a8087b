//! The Lua scripts of the Redis lock. Each runs atomically on the server, in one round trip.

use std::sync::LazyLock;

use redis::Script;

use super::value::owns_lua;

/// A script that compares a key's value with an owner: [`owns_lua`]'s `owns`, then `body`.
fn owner_script(body: &str) -> Script {
    Script::new(&format!("{}{body}", owns_lua()))
}

/// `KEYS[1..n]` the slots of a semaphore (a lock's one slot is taken without a script:
/// `node.rs`), `KEYS[n+1]` the counter; `ARGV[1]` the value to set (the owner value and
/// the holder record: `value.rs`), `ARGV[2]` TTL in ms. `SET NX PX` on the first free
/// slot; only when it set, `INCR` the counter: returns `{1, token, slot}`. Otherwise
/// returns `{0, shortest remaining ttl of the holders in ms}` so a waiter knows how long
/// to sleep (-1 if every slot is held by a key without expiry).
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local slots = #KEYS - 1
local soonest = -1
for i = 1, slots do
  if redis.call('SET', KEYS[i], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return {1, redis.call('INCR', KEYS[slots + 1]), i - 1}
  end
  local pttl = redis.call('PTTL', KEYS[i])
  if pttl == -2 then
    pttl = 0
  end
  if pttl >= 0 and (soonest < 0 or pttl < soonest) then
    soonest = pttl
  end
end
return {0, soonest, -1}
",
    )
});

/// `KEYS[1]` lock; `ARGV[1]` owner value, `ARGV[2]` release channel.
/// Deletes the lock only if it still holds our owner value (bare, or followed by its
/// holder record: `owns`), then wakes the waiters.
/// Returns 1 if it deleted, 0 if the lock was no longer ours (it is left alone).
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    owner_script(
        r"
if owns(redis.call('GET', KEYS[1]), ARGV[1]) then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
",
    )
});

/// `KEYS` the locks to renew; `ARGV` owner value and TTL in ms, for each key in turn.
/// `PEXPIRE`s each lock that still holds our owner value (`owns`); returns 1 or 0 per
/// key. One call renews many locks: the renewal task sends one call per chunk of keys.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    owner_script(
        r"
local renewed = {}
for i, key in ipairs(KEYS) do
  if owns(redis.call('GET', key), ARGV[2 * i - 1]) then
    renewed[i] = redis.call('PEXPIRE', key, ARGV[2 * i])
  else
    renewed[i] = 0
  end
end
return renewed
",
    )
});

/// `KEYS[1]` a token counter, `KEYS[2]` its lock; `ARGV[1]` the highest token this
/// client saw for it, `ARGV[2]` the holder's owner value. If the lock still holds that
/// owner (`owns`), moves the counter up to `ARGV[1]` if it went backwards (evicted,
/// flushed), then `INCR`s it: returns a token above every one handed out before. Returns -1, changing
/// nothing, if the lock is not the holder's any more (expired or deleted before this ran):
/// a newer token must never go to a grant that was already lost, above the live
/// holder's. Run by a holder whose grant came with a token that went backwards.
pub(crate) static ADVANCE: LazyLock<Script> = LazyLock::new(|| {
    owner_script(
        r"
if not owns(redis.call('GET', KEYS[2]), ARGV[2]) then
  return -1
end
local current = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if current < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
return redis.call('INCR', KEYS[1])
",
    )
});

/// `KEYS[1]` lock; `ARGV[1]` the key's whole value as an operator read it, `ARGV[2]` the
/// release channel. Deletes the key only if it still holds exactly that value, then wakes
/// the waiters: `fencelock break` ends the holder it showed and never one granted since,
/// whatever the value holds (a value of another client's, which `owns` would not
/// recognise, is broken too). Returns 1 if it deleted.
pub(crate) static BREAK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
",
    )
});

/// All scripts, for loading them once at connect.
pub(crate) fn all() -> [&'static Script; 5] {
    [&ACQUIRE, &RELEASE, &RENEW, &ADVANCE, &BREAK]
}
