"""A kazoo client the interop tests drive over stdin, one command per line.

    hold RECIPE PATH [PATTERN ...]             -> "held" (waits up to 20 s) | "error ..."
    try RECIPE PATH MILLIS [PATTERN ...]       -> "got" (and holds) | "blocked"
    release                                    -> "released"
    loop RECIPE PATH COUNT MARKER HOLD_MS [PATTERN ...]
                                               -> "done SECTIONS OVERLAPS"
    quit

RECIPE: lock (kazoo's Lock), read (ReadLock), write (WriteLock), semaphore (Semaphore, one
lease). PATTERNs go to extra_lock_patterns. In a loop, each critical section creates MARKER
with O_EXCL (an existing one is an overlap: somebody else is inside), sleeps HOLD_MS and
removes it: the marker is the atomic witness of two holders.
"""
import os
import sys
import time

from kazoo.client import KazooClient


def recipe(zk, kind, path, patterns):
    if kind == "lock":
        return zk.Lock(path, "kazoo-peer", extra_lock_patterns=patterns)
    if kind == "read":
        return zk.ReadLock(path, "kazoo-peer", extra_lock_patterns=patterns)
    if kind == "write":
        return zk.WriteLock(path, "kazoo-peer", extra_lock_patterns=patterns)
    if kind == "semaphore":
        return zk.Semaphore(path, "kazoo-peer", max_leases=1)
    raise ValueError("unknown recipe " + kind)


def acquire(lock, timeout):
    try:
        return lock.acquire(timeout=timeout)
    except Exception:  # kazoo's LockTimeout; the semaphore returns False instead
        lock.cancel()
        return False


def main():
    zk = KazooClient(hosts=sys.argv[1], timeout=10)
    zk.start()
    held = None
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        command = words[0]
        try:
            if command in ("hold", "try") and held is not None:
                reply = "error already holding a lock: release it first"
            elif command == "hold":
                held = recipe(zk, words[1], words[2], tuple(words[3:]))
                reply = "held" if acquire(held, 20) else "error not granted in 20 s"
            elif command == "try":
                lock = recipe(zk, words[1], words[2], tuple(words[4:]))
                if acquire(lock, int(words[3]) / 1000):
                    held = lock
                    reply = "got"
                else:
                    reply = "blocked"
            elif command == "release":
                if held is not None:
                    held.release()
                held = None
                reply = "released"
            elif command == "loop":
                lock = recipe(zk, words[1], words[2], tuple(words[6:]))
                count, marker, hold = int(words[3]), words[4], int(words[5]) / 1000
                sections = overlaps = 0
                for _ in range(count):
                    lock.acquire(timeout=60)
                    try:
                        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                        os.close(fd)
                        mine = True
                    except FileExistsError:
                        overlaps += 1
                        mine = False
                    time.sleep(hold)
                    if mine:
                        os.unlink(marker)
                    sections += 1
                    lock.release()
                reply = "done %d %d" % (sections, overlaps)
            elif command == "quit":
                break
            else:
                reply = "error unknown command " + command
        except Exception as err:  # the test reads the reply; never die silently
            reply = "error %s: %s" % (type(err).__name__, err)
        print(reply, flush=True)
    zk.stop()


if __name__ == "__main__":
    main()
