// The peer of `fencelock bench`'s etcd rows: Go's etcd lock,
// go.etcd.io/etcd/clientv3/concurrency's Mutex (etcd 3.4's client, the lock most etcd
// users run), in lock + release cycles timed inside this process.
//
// Built by the bench itself, not by cargo: the bench embeds this file, writes it into its
// temp dir as GOPATH/src/fencelock-go-mutex/main.go and runs, in that directory,
//
//	GO111MODULE=off GOPATH=<tmp>/gopath:/usr/share/gocode GOCACHE=<tmp>/gocache \
//	  GOFLAGS= CGO_ENABLED=0 go build -o <tmp>/go-mutex .
//
// with Debian's golang-go (Go 1.19) and golang-etcd-server-dev (etcd 3.4.23's sources and
// every package they import, under /usr/share/gocode): GOPATH mode, nothing downloaded.
// By hand, from this directory: the same command with GOPATH=/usr/share/gocode.
//
// Usage:
//
//	go-mutex -version
//	go-mutex -endpoints http://127.0.0.1:2379 -mode distinct -n 8 -duration 3s -prefix p
//	go-mutex -endpoints http://127.0.0.1:2379 -mode contended -n 8 -duration 3s -prefix p
//
// distinct: n goroutines, each locking and releasing a name of its own (<prefix>/<i>),
// one cycle after another, sharing ONE client and ONE session (one lease), as fencelock's
// tasks share one client and its one session.
//
// contended: n goroutines lock and release one name (<prefix>/contended). They share the
// client but each has a session of its own: a concurrency.Mutex's key is the name plus
// the session's lease, so goroutines sharing a session would share one key and all "hold"
// the lock at once. A session per waiter is what Go's Mutex needs to exclude anyone.
//
// Every goroutine makes one untimed cycle first (the warm-up: connections, the session,
// the first key); then the clock starts and each loops until the duration has passed.
//
// Output on stdout, one record per line, for the bench to parse:
//
//	cycle <microseconds>                 a lock + release, from Lock's call to Unlock's return
//	grant <acquired_ns> <releasing_ns>   contended only: when Lock returned and when Unlock
//	                                     was called, in ns since the clock started
//	errors <n>                           failed cycles (not timed); the first on stderr
//	elapsed_us <microseconds>            from the clock's start to the last goroutine's end
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
	"go.etcd.io/etcd/version"
)

type grant struct{ acquired, releasing time.Duration }

type result struct {
	cycles []time.Duration
	grants []grant
	errors int
	first  error
}

func main() {
	endpoints := flag.String("endpoints", "http://127.0.0.1:2379", "etcd endpoints, comma-separated (plaintext)")
	mode := flag.String("mode", "distinct", "distinct (a name per goroutine) or contended (one name)")
	n := flag.Int("n", 1, "goroutines: the concurrency (distinct) or the waiters (contended)")
	duration := flag.Duration("duration", 3*time.Second, "how long the timed cycles run")
	prefix := flag.String("prefix", "bench-go", "key prefix of the lock names")
	printVersion := flag.Bool("version", false, "print the Go and etcd client versions and exit")
	flag.Parse()
	if *printVersion {
		fmt.Printf("%s, go.etcd.io/etcd/clientv3 %s\n", runtime.Version(), version.Version)
		return
	}
	if *n < 1 || (*mode != "distinct" && *mode != "contended") {
		fmt.Fprintln(os.Stderr, "go-mutex: -n must be at least 1 and -mode distinct or contended")
		os.Exit(2)
	}
	if err := run(strings.Split(*endpoints, ","), *mode, *n, *duration, *prefix); err != nil {
		fmt.Fprintln(os.Stderr, "go-mutex:", err)
		os.Exit(1)
	}
}

func run(endpoints []string, mode string, n int, duration time.Duration, prefix string) error {
	client, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 10 * time.Second,
	})
	if err != nil {
		return err
	}
	defer client.Close()
	// A bound on the whole run, should a lock never come.
	ctx, cancel := context.WithTimeout(context.Background(), duration+60*time.Second)
	defer cancel()

	mutexes := make([]*concurrency.Mutex, n)
	if mode == "distinct" {
		session, err := concurrency.NewSession(client, concurrency.WithContext(ctx))
		if err != nil {
			return err
		}
		defer session.Close()
		for i := range mutexes {
			mutexes[i] = concurrency.NewMutex(session, fmt.Sprintf("%s/%d", prefix, i))
		}
	} else {
		for i := range mutexes {
			session, err := concurrency.NewSession(client, concurrency.WithContext(ctx))
			if err != nil {
				return err
			}
			defer session.Close()
			mutexes[i] = concurrency.NewMutex(session, prefix+"/contended")
		}
	}

	// The warm-up: one untimed cycle per goroutine, all of them done before the clock
	// starts.
	var warm sync.WaitGroup
	warmErrors := make([]error, n)
	for i := range mutexes {
		warm.Add(1)
		go func(i int) {
			defer warm.Done()
			if err := mutexes[i].Lock(ctx); err != nil {
				warmErrors[i] = err
				return
			}
			warmErrors[i] = mutexes[i].Unlock(ctx)
		}(i)
	}
	warm.Wait()
	for _, err := range warmErrors {
		if err != nil {
			return fmt.Errorf("warm-up cycle: %w", err)
		}
	}

	started := time.Now()
	deadline := started.Add(duration)
	results := make([]result, n)
	var done sync.WaitGroup
	for i := range mutexes {
		done.Add(1)
		go func(m *concurrency.Mutex, r *result) {
			defer done.Done()
			for time.Now().Before(deadline) {
				began := time.Now()
				if err := m.Lock(ctx); err != nil {
					r.fail(err)
					continue
				}
				// As the bench's contended cells do: the holder releases at once.
				acquired := time.Now()
				releasing := time.Now()
				if mode == "contended" {
					r.grants = append(r.grants, grant{acquired.Sub(started), releasing.Sub(started)})
				}
				if err := m.Unlock(ctx); err != nil {
					r.fail(err)
					continue
				}
				r.cycles = append(r.cycles, time.Since(began))
			}
		}(mutexes[i], &results[i])
	}
	done.Wait()
	elapsed := time.Since(started)

	out := bufio.NewWriter(os.Stdout)
	errors, cycles := 0, 0
	var first error
	for _, r := range results {
		for _, c := range r.cycles {
			fmt.Fprintf(out, "cycle %d\n", c.Microseconds())
		}
		for _, g := range r.grants {
			fmt.Fprintf(out, "grant %d %d\n", g.acquired.Nanoseconds(), g.releasing.Nanoseconds())
		}
		errors += r.errors
		cycles += len(r.cycles)
		if first == nil {
			first = r.first
		}
	}
	fmt.Fprintf(out, "errors %d\n", errors)
	fmt.Fprintf(out, "elapsed_us %d\n", elapsed.Microseconds())
	if err := out.Flush(); err != nil {
		return err
	}
	if first != nil {
		fmt.Fprintln(os.Stderr, "go-mutex: first failed cycle:", first)
	}
	if cycles == 0 {
		return fmt.Errorf("every cycle failed: %v", first)
	}
	return nil
}

func (r *result) fail(err error) {
	r.errors++
	if r.first == nil {
		r.first = err
	}
}
