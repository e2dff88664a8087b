// An Apache Curator client the interop tests drive over stdin, one command per line: the
// same protocol as kazoo_peer.py (hold, try, release, loop, quit). RECIPE: mutex
// (InterProcessMutex), read and write (InterProcessReadWriteLock), semaphore
// (InterProcessSemaphoreV2 with one lease). Compiled by the test with the JDK's javac
// against Debian's libcurator-recipes-java.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessLock;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryNTimes;

public class CuratorPeer {
    /** One acquisition of a recipe: a lock, or a semaphore's lease. */
    interface Held {
        boolean acquire(long millis) throws Exception;
        void release() throws Exception;
    }

    static Held recipe(CuratorFramework client, String kind, String path) {
        switch (kind) {
            case "mutex": return wrap(new InterProcessMutex(client, path));
            case "read": return wrap(new InterProcessReadWriteLock(client, path).readLock());
            case "write": return wrap(new InterProcessReadWriteLock(client, path).writeLock());
            case "semaphore": {
                InterProcessSemaphoreV2 semaphore = new InterProcessSemaphoreV2(client, path, 1);
                return new Held() {
                    Lease lease;
                    public boolean acquire(long millis) throws Exception {
                        lease = semaphore.acquire(millis, TimeUnit.MILLISECONDS);
                        return lease != null;
                    }
                    public void release() throws Exception { semaphore.returnLease(lease); }
                };
            }
            default: throw new IllegalArgumentException("unknown recipe " + kind);
        }
    }

    static Held wrap(InterProcessLock lock) {
        return new Held() {
            public boolean acquire(long millis) throws Exception {
                return lock.acquire(millis, TimeUnit.MILLISECONDS);
            }
            public void release() throws Exception { lock.release(); }
        };
    }

    public static void main(String[] args) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.newClient(args[0], 10000, 10000,
            new RetryNTimes(10, 100));
        client.start();
        client.blockUntilConnected(20, TimeUnit.SECONDS);
        Held held = null;
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        System.out.println("ready");
        System.out.flush();
        String line;
        while ((line = in.readLine()) != null) {
            String[] words = line.trim().split("\\s+");
            if (words[0].isEmpty()) continue;
            String reply;
            try {
                if ((words[0].equals("hold") || words[0].equals("try")) && held != null) {
                    throw new IllegalStateException("already holding a lock: release it first");
                }
                switch (words[0]) {
                    case "hold":
                        held = recipe(client, words[1], words[2]);
                        reply = held.acquire(20000) ? "held" : "error not granted in 20 s";
                        break;
                    case "try": {
                        Held lock = recipe(client, words[1], words[2]);
                        if (lock.acquire(Long.parseLong(words[3]))) {
                            held = lock;
                            reply = "got";
                        } else {
                            reply = "blocked";
                        }
                        break;
                    }
                    case "release":
                        if (held != null) held.release();
                        held = null;
                        reply = "released";
                        break;
                    case "loop": {
                        Held lock = recipe(client, words[1], words[2]);
                        int count = Integer.parseInt(words[3]);
                        Path marker = Paths.get(words[4]);
                        long hold = Long.parseLong(words[5]);
                        int sections = 0, overlaps = 0;
                        for (int i = 0; i < count; i++) {
                            if (!lock.acquire(60000)) throw new IllegalStateException("not granted in 60 s");
                            boolean mine;
                            try {
                                Files.createFile(marker);
                                mine = true;
                            } catch (FileAlreadyExistsException e) {
                                overlaps++;
                                mine = false;
                            }
                            Thread.sleep(hold);
                            if (mine) Files.delete(marker);
                            sections++;
                            lock.release();
                        }
                        reply = "done " + sections + " " + overlaps;
                        break;
                    }
                    case "quit":
                        client.close();
                        return;
                    default:
                        reply = "error unknown command " + words[0];
                }
            } catch (Exception e) {
                reply = "error " + e.getClass().getSimpleName() + ": " + e.getMessage();
            }
            System.out.println(reply);
            System.out.flush();
        }
        client.close();
    }
}
