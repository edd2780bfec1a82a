package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"

	"github.com/musterhq/muster/internal/cli"
	"github.com/musterhq/muster/internal/dnszone"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/resolver"
)

// loadgenDNS fires DNS queries at muster's zone from closed-loop clients
// (each sends its next query when the last is answered) and prints
// queries per second and latency. With --addr it measures a running
// muster (muster dev serves 127.0.0.1:8053; --names lists what to ask);
// without, it builds the zone in process from a synthetic hub of
// --services services of --endpoints endpoints each, with --changes views
// published per second while it runs, and asks for their A, SRV and
// per-zone names and a tenth of unknown names.
func loadgenDNS(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		addr, names, cpuProfile      string
		edns                         int
		services, endpoints, clients int
		changes                      float64
		duration                     time.Duration
	)
	fs := cli.NewFlags("loadgen dns", stderr)
	fs.StringVar(&addr, "addr", "", "a muster DNS zone to measure (e.g. 127.0.0.1:8053); empty: an in-process zone")
	fs.StringVar(&names, "names", "", "with --addr: comma-separated names to ask for A records (default api.muster.internal.)")
	fs.IntVar(&services, "services", 450, "in process: services in the zone")
	fs.IntVar(&endpoints, "endpoints", 130, "in process: endpoints per service")
	fs.Float64Var(&changes, "changes", 40, "in process: view changes published per second while querying")
	fs.IntVar(&clients, "clients", 8, "concurrent closed-loop clients, one UDP socket each")
	fs.DurationVar(&duration, "duration", 10*time.Second, "how long to query")
	fs.IntVar(&edns, "edns", 1232, "EDNS0 buffer size the clients advertise (0: no EDNS0, 512-byte answers)")
	fs.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the querying to this file")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	var qs []dns.Question
	zoneName := dnszone.DefaultZone
	stopChurn := func() int { return 0 }
	if addr == "" {
		hub := stream.NewHub(stream.Config{})
		views := make([]resolver.View, services)
		for i := range services {
			views[i] = synthView(fmt.Sprintf("svc-%03d", i), uint64(i+1), endpoints, 0)
		}
		hub.Publish(updates(views))
		srv, err := dnszone.New(dnszone.Config{Addr: "127.0.0.1:0", Services: []string{dnszone.AllServices}, Hub: hub})
		if err != nil {
			return err
		}
		if err := srv.Start(ctx); err != nil {
			return err
		}
		defer srv.Stop()
		deadline := time.Now().Add(30 * time.Second)
		for srv.Services() < services {
			if time.Now().After(deadline) {
				return fmt.Errorf("the in-process zone holds %d of %d services after 30 s", srv.Services(), services)
			}
			time.Sleep(20 * time.Millisecond) // polling with a deadline
		}
		addr = srv.Addr().String()
		for i := range services {
			svc := fmt.Sprintf("svc-%03d", i)
			qs = append(qs, dns.Question{Name: svc + "." + zoneName, Qtype: dns.TypeA, Qclass: dns.ClassINET},
				dns.Question{Name: "_" + svc + "._tcp." + zoneName, Qtype: dns.TypeSRV, Qclass: dns.ClassINET},
				dns.Question{Name: "az1." + svc + "." + zoneName, Qtype: dns.TypeA, Qclass: dns.ClassINET})
		}
		for i := range len(qs) / 9 { // a tenth unknown
			qs = append(qs, dns.Question{Name: fmt.Sprintf("nope-%d.%s", i, zoneName), Qtype: dns.TypeA, Qclass: dns.ClassINET})
		}
		stopChurn = churn(hub, views, endpoints, changes)
		fmt.Fprintf(stdout, "in-process zone: %d services x %d endpoints on %s, %.0f view changes/s while querying\n", services, endpoints, addr, changes)
	} else {
		if names == "" {
			names = "api." + zoneName
		}
		for _, n := range splitComma(names) {
			qs = append(qs, dns.Question{Name: dns.Fqdn(n), Qtype: dns.TypeA, Qclass: dns.ClassINET})
		}
	}
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	cpu0 := cpuTime()
	res := queryLoop(ctx, addr, qs, clients, edns, duration)
	cpu := cpuTime() - cpu0
	changed := stopChurn()
	slices.Sort(res.took)
	q := func(p float64) time.Duration {
		if len(res.took) == 0 {
			return 0
		}
		return res.took[min(len(res.took)-1, int(p*float64(len(res.took))))]
	}
	fmt.Fprintf(stdout, "%d clients (EDNS0 buffer %d) for %s against %s: %d queries, %.0f queries/s; latency p50 %s p99 %s max %s; %d NOERROR, %d NXDOMAIN, %d truncated, %d errors; %d view changes applied meanwhile; GOMAXPROCS %d; this process used %.1f CPU-seconds (%.0f queries per CPU-second of this process: the clients, and the zone when in process)\n",
		clients, edns, duration, addr, len(res.took), float64(len(res.took))/res.elapsed.Seconds(), q(0.5), q(0.99), q(1),
		res.noerror, res.nxdomain, res.truncated, res.errors, changed, runtime.GOMAXPROCS(0), cpu.Seconds(), float64(len(res.took))/cpu.Seconds())
	return nil
}

type dnsResult struct {
	took                                 []time.Duration
	elapsed                              time.Duration
	noerror, nxdomain, truncated, errors int64
}

// queryLoop runs clients closed-loop clients over qs for d.
func queryLoop(ctx context.Context, addr string, qs []dns.Question, clients, edns int, d time.Duration) dnsResult {
	var res dnsResult
	var mu sync.Mutex
	var noerror, nxdomain, truncated, errs atomic.Int64
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			conn, err := dns.Dial("udp", addr)
			if err != nil {
				errs.Add(1)
				return
			}
			defer conn.Close()
			conn.UDPSize = uint16(max(edns, dns.MinMsgSize))
			rnd := rand.New(rand.NewPCG(uint64(c), 42))
			var took []time.Duration
			m := new(dns.Msg)
			if edns > 0 {
				m.SetEdns0(uint16(edns), false)
			}
			for ctx.Err() == nil {
				m.Question = []dns.Question{qs[rnd.IntN(len(qs))]}
				m.Id = dns.Id()
				t0 := time.Now()
				_ = conn.SetDeadline(t0.Add(2 * time.Second))
				if err := conn.WriteMsg(m); err != nil {
					errs.Add(1)
					continue
				}
				r, err := conn.ReadMsg()
				if err != nil {
					errs.Add(1)
					continue
				}
				took = append(took, time.Since(t0))
				switch {
				case r.Truncated:
					truncated.Add(1)
				case r.Rcode == dns.RcodeSuccess:
					noerror.Add(1)
				case r.Rcode == dns.RcodeNameError:
					nxdomain.Add(1)
				default:
					errs.Add(1)
				}
			}
			mu.Lock()
			res.took = append(res.took, took...)
			mu.Unlock()
		})
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	res.noerror, res.nxdomain, res.truncated, res.errors = noerror.Load(), nxdomain.Load(), truncated.Load(), errs.Load()
	return res
}

// synthView is a view of n endpoints in three zones; the endpoint at
// index down (if in range) is ineligible.
func synthView(service string, version uint64, n, down int) resolver.View {
	h := fnv.New32a()
	h.Write([]byte(service))
	prefix := h.Sum32()
	eps := make([]resolver.Endpoint, n)
	for i := range n {
		st := "eligible"
		if i == down {
			st = resolver.StateIneligible
		}
		eps[i] = resolver.Endpoint{InstanceID: fmt.Sprintf("%08x-0000-4000-8000-%012d", prefix, i), Address: fmt.Sprintf("10.%d.%d.%d", i/65536%256, i/256%256, i%256),
			Port: 8080, Zone: fmt.Sprintf("az%d", i%3+1), State: st, Weight: 1, Health: resolver.HealthKnown}
	}
	slices.SortFunc(eps, func(a, b resolver.Endpoint) int { return cmpStr(a.InstanceID, b.InstanceID) })
	zones := map[string]resolver.Zone{}
	for _, z := range []string{"az1", "az2", "az3"} {
		zones[z] = resolver.Zone{Guard: resolver.GuardOK}
	}
	return resolver.View{Service: service, Version: version, Endpoints: eps, Zones: zones, Checksum: resolver.Checksum(eps)}
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func updates(views []resolver.View) []stream.Update {
	out := make([]stream.Update, 0, len(views))
	for _, v := range views {
		b, _ := json.Marshal(v)
		out = append(out, stream.Update{View: &stream.Frame{Kind: stream.KindView, Service: v.Service, Version: v.Version, JSON: b}})
	}
	return out
}

// churn publishes perSec full views a second (one endpoint of a random
// service going ineligible, another coming back) until the returned stop
// is called, which says how many it published.
func churn(hub *stream.Hub, views []resolver.View, n int, perSec float64) func() int {
	if perSec <= 0 {
		return func() int { return 0 }
	}
	done := make(chan struct{})
	var count atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Duration(float64(time.Second) / perSec))
		defer t.Stop()
		version := uint64(len(views))
		rnd := rand.New(rand.NewPCG(7, 7))
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			version++
			i := rnd.IntN(len(views))
			v := synthView(views[i].Service, version, n, rnd.IntN(n))
			hub.Publish(updates([]resolver.View{v}))
			count.Add(1)
		}
	})
	return func() int { close(done); wg.Wait(); return int(count.Load()) }
}

func splitComma(s string) []string {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// cpuTime is the user and system CPU time this process has used: on a
// shared machine, queries per CPU-second says more than queries per
// second.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
