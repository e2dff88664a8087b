//! The Lua scripts of the Redis lock. Each runs atomically on the server, in one round trip.

use std::sync::LazyLock;

use redis::Script;

use super::value::{owns_expression, owns_lua};

/// A script that compares a key's value with an owner: [`owns_lua`]'s `owns`, then `body`.
fn owner_script(body: &str) -> Script {
    Script::new(&format!("{}{body}", owns_lua()))
}

/// The waiters' set of a lock (`LockKeys::waiters`): a sorted set of waiter ids scored
/// by when each registration expires, in the server's milliseconds (`TIME`: scripts
/// replicate their effects since Redis 5 and always in 7, so a script may read the clock
/// and then write). A release publishes only while the set holds a live waiter: a
/// `PUBLISH` costs the server more than the rest of the release, and is needed only
/// when someone listens (issue 38).
///
/// `register(waiters, id, lease)`: adds or refreshes `id`, expiring `lease` ms from now,
/// and keeps the whole set alive at least that long (`PEXPIRE`, never shortened: the set
/// outlives every registration in it, and nothing is left forever). A key of another type
/// under the name is left alone, and [`RELEASE`] then always publishes.
///
/// `unregister(waiters, id)`: removes `id`, if the key is a set.
///
/// `TIME` before a write needs effects replication: the default since Redis 5, switched on
/// here for older servers (`redis.replicate_commands`, a no-op that Redis 7 keeps).
const WAITERS_LUA: &str = r"
if redis.replicate_commands then
  redis.replicate_commands()
end
local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
local function register(waiters, id, lease)
  local kind = redis.call('TYPE', waiters).ok
  if kind ~= 'none' and kind ~= 'zset' then
    return
  end
  redis.call('ZADD', waiters, now_ms() + tonumber(lease), id)
  if redis.call('PTTL', waiters) < tonumber(lease) then
    redis.call('PEXPIRE', waiters, lease)
  end
end
local function unregister(waiters, id)
  if id ~= '' and redis.call('TYPE', waiters).ok == 'zset' then
    redis.call('ZREM', waiters, id)
  end
end
";

/// A script with the waiters' functions ([`WAITERS_LUA`]) and `owns`, then `body`.
fn waiters_script(body: &str) -> Script {
    Script::new(&format!("{}{WAITERS_LUA}{body}", owns_lua()))
}

/// `KEYS[1..n]` the slots of a semaphore (a lock's one slot is taken without a script:
/// `node.rs`), `KEYS[n+1]` the counter, `KEYS[n+2]` the waiters' set; `ARGV[1]` the value
/// to set (the owner value and the holder record: `value.rs`), `ARGV[2]` TTL in ms,
/// `ARGV[3]` the waiter's id (empty for an acquisition that does not wait on release
/// messages), `ARGV[4]` how long its registration lasts, in ms. `SET NX PX` on the first
/// free slot; only when it set, `INCR` the counter and unregister the waiter: returns
/// `{1, token, slot}`. Otherwise registers the waiter, in the same step as the refusal
/// (a release after this sees it and publishes), and returns `{0, shortest remaining ttl
/// of the holders in ms}` so a waiter knows how long to sleep (-1 if every slot is held
/// by a key without expiry).
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    waiters_script(
        r"
local slots = #KEYS - 2
local waiters = KEYS[slots + 2]
local soonest = -1
for i = 1, slots do
  if redis.call('SET', KEYS[i], ARGV[1], 'NX', 'PX', ARGV[2]) then
    unregister(waiters, ARGV[3])
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
if ARGV[3] ~= '' then
  register(waiters, ARGV[3], ARGV[4])
end
return {0, soonest, -1}
",
    )
});

/// Several locks taken together, all or none (`lock_all.rs`). `KEYS`: for each lock in
/// turn, its key, its token counter and its waiters' set (`3 * i - 2`, `3 * i - 1`,
/// `3 * i`); `ARGV` as [`ACQUIRE`]'s: the value to set (one owner value for every lock,
/// and the holder record), TTL in ms, the waiter's id (empty for an acquisition that does
/// not wait on release messages), how long its registration lasts in ms; then `ARGV[5]`,
/// the lock (1 to n) whose set the waiter's last refusal registered it in, 0 for none.
///
/// First looks at every lock (`PTTL`: -2 is no key). If every one is free, takes each as
/// [`ACQUIRE`] takes one (`SET NX PX`, `INCR` of its counter: each lock's token from its
/// own counter), unregisters the waiter from every lock's set (it may have registered in
/// any of them before), and returns `{1, token of lock 1, token of lock 2, ...}`. If any is
/// held, writes no lock and no counter, picks the held lock that expires last (one
/// without expiry before any other; the first of equals), registers the waiter in that
/// lock's set alone (`register`, in this same step: its release after this sees the
/// registration and publishes, one before it left the lock free for this look), leaves
/// the set of `ARGV[5]` if that is another lock's, and returns `{0, that lock's remaining
/// ttl in ms (-1: no expiry), its number}`. One set is enough: no grant can come while
/// that lock is held, its release publishes, and the waiter sleeps no longer than its
/// expiry; woken, its next refusal registers with whichever lock then stands in its way.
/// Registering with every held lock made every release of any of them publish and wake
/// the waiter, for nothing while the others were held. The look comes before any write,
/// so a refusal changes nothing but the registrations. (Redis runs a script alone: no
/// other command falls between the look and the writes; the lock keys must be on one
/// server, which they are: no Redis Cluster.)
pub(crate) static LOCK_ALL: LazyLock<Script> = LazyLock::new(|| {
    waiters_script(
        r"
local locks = #KEYS / 3
local last, last_ttl = 0, -2
for i = 1, locks do
  local pttl = redis.call('PTTL', KEYS[3 * i - 2])
  if pttl ~= -2 and last_ttl ~= -1 and (pttl == -1 or pttl > last_ttl) then
    last, last_ttl = i, pttl
  end
end
if last > 0 then
  if ARGV[3] ~= '' then
    local previous = tonumber(ARGV[5]) or 0
    if previous >= 1 and previous <= locks and previous ~= last then
      unregister(KEYS[3 * previous], ARGV[3])
    end
    register(KEYS[3 * last], ARGV[3], ARGV[4])
  end
  return {0, last_ttl, last}
end
local granted = {1}
for i = 1, locks do
  redis.call('SET', KEYS[3 * i - 2], ARGV[1], 'NX', 'PX', ARGV[2])
  unregister(KEYS[3 * i], ARGV[3])
  granted[i + 1] = redis.call('INCR', KEYS[3 * i - 1])
end
return granted
",
    )
});

/// `KEYS[1]` lock, `KEYS[2]` its waiters' set; `ARGV[1]` owner value, `ARGV[2]` release
/// channel, `ARGV[3]` the holder's own waiter id if it waited for the lock (absent
/// otherwise: one argument less to send and parse on every uncontended cycle).
/// Unregisters the holder's id, then deletes the lock only if it still holds our owner
/// value (bare, or followed by its holder record: [`owns_expression`]), and publishes on
/// the channel if a waiter is left: it drops the registrations that expired and
/// publishes if any is left, or if the key under the set's name is not a set (publish,
/// when unsure). The set is read before the delete, so that a role that may not run
/// these commands (an ACL from before the waiters' set) fails the release before it
/// deletes anything, never after (without `+type`, only once a set exists).
/// Returns 1 if it deleted, 0 if the lock was no longer ours (it is left alone).
///
/// A lock's holder stays registered from its grant to this release (unregistering at the
/// grant would take a second request: the grant is a pipeline, not a script), which
/// costs nothing: no other release of the lock runs while it holds it.
///
/// It runs on every lock cycle, so it is written out rather than built from the shared
/// functions: a function defined in a script is a closure made on every call, and the
/// ones it used (`owns` and [`WAITERS_LUA`]'s) cost the server 0.2-0.3 us per release
/// (`INFO commandstats`, the minimum of five rounds of 30,000 calls: 2.55 us a call
/// against 2.24 us written out). One `TYPE` serves both the unregistering and the wake
/// decision (an id removed from a set of one deletes the set: the count after the
/// cleanup says so), asked only when a key stands under the set's name: a `PTTL` (-2: no
/// key) answers an integer, where `TYPE`'s status reply becomes a Lua table, and on the
/// uncontended cycle (no set) the release then costs the server about 1,550 fewer
/// instructions of its 49,000 per cycle (callgrind on redis-server 7.0, 5,000 cycles;
/// `PTTL` rather than `EXISTS`: the ACLs of `docs/security.md` already allow it). The
/// clock is read only when a set exists. `replicate_commands` comes first, before any
/// command: on Redis 3.2 to 4 a script may write after `TIME` only with effects
/// replication, switched on before its first write, and on Redis 5 to 6.2 `PTTL` itself
/// counts as a random command, after which a write fails unless effects replication is
/// on (`lua-replicate-commands no` switches the default off); a no-op since Redis 7.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"
if redis.replicate_commands then
  redis.replicate_commands()
end
local kind = 'none'
if redis.call('PTTL', KEYS[2]) ~= -2 then
  kind = redis.call('TYPE', KEYS[2]).ok
end
local id = ARGV[3]
if kind == 'zset' and id and id ~= '' then
  redis.call('ZREM', KEYS[2], id)
end
local value, owner = redis.call('GET', KEYS[1]), ARGV[1]
if {owns} then
  local wake = kind ~= 'none'
  if kind == 'zset' then
    local now = redis.call('TIME')
    local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
    wake = redis.call('ZCARD', KEYS[2]) > 0
  end
  redis.call('DEL', KEYS[1])
  if wake then
    redis.call('PUBLISH', ARGV[2], 'released')
  end
  return 1
end
return 0
",
        owns = owns_expression("value", "owner")
    ))
});

/// `KEYS[1]` lock, `KEYS[2]` its waiters' set; `ARGV[1]` the waiter's id, `ARGV[2]` how
/// long its registration lasts, in ms. Run by a waiter whose `SET NX` was refused: if the
/// lock is still held, registers the waiter (`register`) and returns the lock's `PTTL`;
/// if it is gone (released since the refusal), registers nothing and returns -2, and the
/// waiter tries again at once. The check and the registration are one step: a release
/// either came before it (the waiter sees the lock free) or sees the registration and
/// publishes. Never a release between "still held" and "registered" that publishes to
/// no one while the waiter goes to sleep.
pub(crate) static REGISTER: LazyLock<Script> = LazyLock::new(|| {
    waiters_script(
        r"
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then
  return -2
end
register(KEYS[2], ARGV[1], ARGV[2])
return pttl
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
pub(crate) fn all() -> [&'static Script; 7] {
    [
        &ACQUIRE, &LOCK_ALL, &RELEASE, &REGISTER, &RENEW, &ADVANCE, &BREAK,
    ]
}
