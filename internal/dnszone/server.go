package dnszone

import (
	"context"
	"errors"
	"fmt"
	jsonv2 "github.com/go-json-experiment/json"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/worker"
	"github.com/musterhq/muster/resolver"
)

// cachingCaveat is the TXT record at _muster.ZONE (ADR-10: the weaker
// guarantee is stated, not hidden).
var cachingCaveat = []string{
	"muster DNS is a compatibility surface: resolvers, runtimes and sidecars may cache answers beyond the TTL or ignore it",
	"withdrawals reach DNS clients only as fast as their caches expire; the watch stream and xDS are the surfaces with a propagation budget",
}

// Server is muster's authoritative DNS zone: a worker that follows the
// hub's views into an in-memory zone, and the UDP and TCP listeners that
// answer from it. Queries never touch PostgreSQL.
type Server struct {
	cfg Config
	log *slog.Logger
	m   *metrics

	cur    atomic.Pointer[zone]
	rotate atomic.Uint32 // round-robin offset of address answers
	// refusalLogged is when a refused transfer was last logged (Unix ns);
	// refusedQuiet counts those refused since.
	refusalLogged, refusedQuiet atomic.Int64
	served                      map[string]bool
	reserved                    map[string]bool // service labels taken by in-zone nameservers
	xfrFrom                     map[netip.Addr]bool
	tsig                        map[string]string

	follower worker.Runner
	notifier worker.Runner
	notify   chan struct{}

	mu      sync.Mutex
	servers []*dns.Server
	addr    net.Addr
	done    sync.WaitGroup

	// The follower's state, touched by its goroutine only (and by tests
	// that step it before Start).
	held    map[string]*resolver.View
	snaps   map[string]*resolver.Snapshot // of held, by series
	pending map[string]*serviceRecords    // changed since the last commit; nil value: gone
	ready   bool                          // Config.Ready has held: the zone may be served
}

// New validates cfg and returns a stopped Server holding an empty zone.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger.With("worker", "dns"), m: m, served: map[string]bool{}, reserved: map[string]bool{},
		xfrFrom: map[netip.Addr]bool{}, notify: make(chan struct{}, 1), held: map[string]*resolver.View{}, snaps: map[string]*resolver.Snapshot{}, pending: map[string]*serviceRecords{}}
	for _, name := range cfg.Services {
		s.served[name] = true
	}
	for _, ns := range cfg.Nameservers {
		if rel, ok := strings.CutSuffix(ns, "."+cfg.Zone); ok {
			s.reserved[rel[strings.LastIndexByte(rel, '.')+1:]] = true
		}
	}
	for _, sec := range cfg.Secondaries {
		s.xfrFrom[sec.Addr().Unmap()] = true
	}
	if cfg.TSIGKeyName != "" {
		s.tsig = map[string]string{cfg.TSIGKeyName: cfg.TSIGSecret}
	}
	s.ready = cfg.Ready == nil
	s.cur.Store(s.newZone(nil, nil))
	return s, nil
}

// Addr is the address the zone is served on (UDP and TCP), once started;
// nil before, or when an Optional address could not be listened on.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Zone is the zone's name (canonical, fully qualified).
func (s *Server) Zone() string { return s.cfg.Zone }

// Services is how many services the zone serves now.
func (s *Server) Services() int { return len(s.cur.Load().services) }

// Serial is the zone's current SOA serial.
func (s *Server) Serial() uint32 { return s.cur.Load().serial }

// Start listens on Addr (TCP first, then UDP on the same port), starts
// answering, and follows the hub until Stop.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.addr != nil {
		return worker.ErrStarted
	}
	ln, err := net.Listen("tcp", s.cfg.Addr)
	var pc net.PacketConn
	if err == nil {
		if pc, err = net.ListenPacket("udp", ln.Addr().String()); err != nil {
			ln.Close()
		}
	}
	if err != nil {
		if s.cfg.Optional {
			s.log.Warn("dns: cannot listen; serving no DNS (give another address to serve it)", "addr", s.cfg.Addr, "err", err)
			return nil
		}
		return fmt.Errorf("dns: listen on %s: %w", s.cfg.Addr, err)
	}
	s.addr = ln.Addr()
	common := func(srv *dns.Server) *dns.Server {
		srv.Handler = s
		srv.TsigSecret = s.tsig
		srv.UDPSize = dns.MaxMsgSize // the read buffer: signed IXFR requests outgrow 512
		srv.ReadTimeout, srv.WriteTimeout = 2*time.Second, 5*time.Second
		srv.IdleTimeout = func() time.Duration { return 10 * time.Second }
		return srv
	}
	s.servers = []*dns.Server{common(&dns.Server{Listener: ln, Net: "tcp"}), common(&dns.Server{PacketConn: pc, Net: "udp"})}
	// Wait until both serve: a Stop before then could not shut them down.
	started := make(chan struct{}, len(s.servers))
	for _, srv := range s.servers {
		srv.NotifyStartedFunc = func() { started <- struct{}{} }
		s.done.Go(func() {
			if err := srv.ActivateAndServe(); err != nil {
				s.log.Error("dns listener stopped", "net", srv.Net, "err", err)
				started <- struct{}{}
			}
		})
	}
	for range s.servers {
		<-started
	}
	if err := s.follower.Start(ctx, s.follow); err != nil {
		return err
	}
	if len(s.cfg.Secondaries) > 0 {
		if err := s.notifier.Start(ctx, s.notifyLoop); err != nil {
			return err
		}
	}
	s.log.Info("dns zone serving", "addr", s.addr.String(), "zone", s.cfg.Zone, "services", strings.Join(s.cfg.Services, ","),
		"secondaries", len(s.cfg.Secondaries))
	return nil
}

// Stop stops answering and following. Safe to call twice or before Start.
func (s *Server) Stop() {
	s.mu.Lock()
	servers := s.servers
	s.servers = nil
	s.mu.Unlock()
	for _, srv := range servers {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := srv.ShutdownContext(ctx); err != nil {
			s.log.Warn("dns listener shutdown", "net", srv.Net, "err", err)
		}
		cancel()
	}
	s.done.Wait()
	s.follower.Stop()
	s.notifier.Stop()
}

// commitEvery is how often the follower commits at most: the changes of
// a tenth of a second make one serial.
const commitEvery = 100 * time.Millisecond

// follow is the follower's loop: subscribe to the served services,
// apply each frame to the held views, and commit the zone at most once
// per commitEvery (timed by the monotonic clock: a step of the wall
// clock neither holds commits back nor lets them through faster).
func (s *Server) follow(ctx context.Context) {
	var sub *stream.Subscription
	var subscribed []string
	defer func() {
		if sub != nil {
			sub.Close()
		}
	}()
	resubscribe := func() {
		want := s.wanted()
		if sub != nil && slices.Equal(want, subscribed) {
			return
		}
		next, err := s.cfg.Hub.Follow(want, 0)
		if err != nil {
			if !errors.Is(err, stream.ErrClosed) {
				s.log.Warn("dns: subscribe to the hub", "err", err)
			}
			return // keep serving the zone held
		}
		if sub != nil {
			sub.Close()
		}
		sub, subscribed = next, want
		for _, f := range sub.Initial {
			s.apply(f)
		}
	}
	resubscribe()
	look := time.NewTicker(s.cfg.Interval)
	defer look.Stop()
	commit := time.NewTimer(time.Hour)
	commit.Stop()
	armed := false
	var last time.Time // the last commit (monotonic reading)
	for {
		if !s.ready && s.cfg.Ready() {
			// Views are published since this start: take every one (a
			// new subscription in "*" mode), then serve.
			s.ready = true
			if s.served[AllServices] {
				resubscribe()
			}
			s.log.Info("dns zone ready: views are published", "services", len(s.held))
		}
		var frames <-chan *stream.Frame
		var resync <-chan struct{}
		if sub != nil {
			frames, resync = sub.C(), sub.Resync()
		}
		if s.dirty() && !armed {
			if d := commitEvery - time.Since(last); d <= 0 || last.IsZero() {
				s.commit()
				last = time.Now()
			} else {
				commit.Reset(d)
				armed = true
			}
		}
		select {
		case <-ctx.Done():
			return
		case f := <-frames:
			s.apply(f)
		drain: // take what is queued before committing
			for {
				select {
				case f := <-frames:
					s.apply(f)
				default:
					break drain
				}
			}
		case <-resync:
			for _, f := range sub.TakeResync() {
				s.apply(f)
			}
		case <-look.C:
			if s.served[AllServices] || len(s.cfg.Regions) > 0 {
				resubscribe()
			}
		case <-commit.C:
			armed = false
			s.commit()
			last = time.Now()
		}
	}
}

// wanted lists the services to subscribe to: the configured ones, or
// every service the hub has a view of.
func (s *Server) wanted() []string {
	var names []string
	if s.served[AllServices] {
		names = s.cfg.Hub.Services()
	} else {
		names = slices.Sorted(maps.Keys(s.served))
	}
	names = slices.DeleteFunc(names, func(n string) bool { return s.reserved[n] || !validLabel(n) })
	// Each service's view in the fallback regions the hub holds (issue
	// 29): answered only when the local one has no capacity.
	for _, n := range slices.Clone(names) {
		for _, r := range s.cfg.Regions {
			if _, ok := s.cfg.Hub.View(stream.RemoteSeries(n, r)); ok {
				names = append(names, stream.RemoteSeries(n, r))
			}
		}
	}
	slices.Sort(names)
	return names
}

// records builds service's records from the view answered for it: its
// own region's while that has capacity (a routable endpoint, and not
// every zone drained by a region or zone shift), else the first fallback
// region's (Config.Regions) that has, else its own region's anyway (the
// resolver's rule: muster is never the reason traffic stops). Nil: no
// view of it is held.
func (s *Server) records(service string) *serviceRecords {
	v, snap := s.held[service], s.snaps[service]
	usable := func(sn *resolver.Snapshot) bool { return sn != nil && sn.Routable() > 0 && sn.TrafficShare() > 0 }
	if !usable(snap) {
		for _, r := range s.cfg.Regions {
			name := stream.RemoteSeries(service, r)
			if usable(s.snaps[name]) {
				v, snap = s.held[name], s.snaps[name]
				break
			}
		}
	}
	if v == nil || snap == nil {
		for _, r := range s.cfg.Regions {
			name := stream.RemoteSeries(service, r)
			if s.held[name] != nil && s.snaps[name] != nil {
				v, snap = s.held[name], s.snaps[name]
				break
			}
		}
	}
	if v == nil || snap == nil {
		return nil
	}
	zones := slices.Sorted(maps.Keys(v.Zones))
	return buildService(s.cfg.Zone, service, v.Version, v.GeneratedAt, snap.Targets(), zones, uint32(s.cfg.TTL/time.Second))
}

// apply takes one frame into the held views; a changed service's records
// are rebuilt and wait for the next commit.
func (s *Server) apply(f *stream.Frame) {
	if f == nil || (f.Kind != stream.KindView && f.Kind != stream.KindDelta) {
		return // synced, heartbeat, drain: the zone stays as it is
	}
	held := s.held[f.Service]
	if held != nil && f.Version <= held.Version {
		return
	}
	var next *resolver.View
	if f.Kind == stream.KindDelta && held != nil && f.FromVersion == held.Version {
		var d resolver.Delta
		if err := jsonv2.Unmarshal(f.JSON, &d); err == nil {
			next = applyDelta(held, d)
		}
	}
	if next == nil && f.Kind == stream.KindView {
		next = s.decode(f)
	}
	var snap *resolver.Snapshot
	if next != nil {
		var err error
		if snap, err = resolver.SnapshotOf(*next, time.Now()); err != nil {
			next = nil
		}
	}
	if next == nil {
		// A delta that does not follow (or does not check out): the hub's
		// latest full view.
		latest, ok := s.cfg.Hub.View(f.Service)
		if !ok || (held != nil && latest.Version <= held.Version) {
			s.m.viewErrors.Inc()
			return
		}
		if next = s.decode(latest); next == nil {
			return
		}
		var err error
		if snap, err = resolver.SnapshotOf(*next, time.Now()); err != nil {
			s.m.viewErrors.Inc()
			s.log.Warn("dns: a view that does not check out", "service", f.Service, "version", latest.Version, "err", err)
			return
		}
	}
	s.held[f.Service], s.snaps[f.Service] = next, snap
	service := f.Service
	if base, _, ok := stream.SplitRemote(f.Service); ok {
		service = base
	}
	if sr := s.records(service); sr != nil {
		s.pending[service] = sr
	}
}

func (s *Server) decode(f *stream.Frame) *resolver.View {
	var v resolver.View
	if err := jsonv2.Unmarshal(f.JSON, &v); err != nil || v.Service != f.Service {
		s.m.viewErrors.Inc()
		s.log.Warn("dns: a view that does not decode", "service", f.Service, "version", f.Version, "err", err)
		return nil
	}
	return &v
}

// applyDelta is d applied to v (the resolver's merge, restated on full
// views: upserts replace by instance id, removals go, zones follow). The
// caller checks the result's checksum (SnapshotOf).
func applyDelta(v *resolver.View, d resolver.Delta) *resolver.View {
	if d.Service != v.Service {
		return nil
	}
	byID := make(map[string]resolver.Endpoint, len(v.Endpoints)+len(d.Upserts))
	for _, e := range v.Endpoints {
		byID[e.InstanceID] = e
	}
	for _, e := range d.Upserts {
		byID[e.InstanceID] = e
	}
	for _, id := range d.Removals {
		delete(byID, id)
	}
	zones := maps.Clone(v.Zones)
	if zones == nil {
		zones = map[string]resolver.Zone{}
	}
	maps.Copy(zones, d.Zones)
	for _, z := range d.RemovedZones {
		delete(zones, z)
	}
	eps := slices.SortedFunc(maps.Values(byID), func(a, b resolver.Endpoint) int { return strings.Compare(a.InstanceID, b.InstanceID) })
	return &resolver.View{Service: v.Service, Version: d.Version, Endpoints: eps, Zones: zones, GeneratedAt: d.GeneratedAt, Checksum: d.Checksum}
}

// dirty: there is something to commit (changed services, or the zone
// becoming ready).
func (s *Server) dirty() bool { return len(s.pending) > 0 || s.ready != s.cur.Load().ready }

// commit publishes the pending services as a new zone at its next
// serial (nextPoint), keeps the diff for IXFR and wakes the notifier.
func (s *Server) commit() {
	if !s.dirty() {
		return
	}
	old := s.cur.Load()
	next := s.newZone(old, s.pending)
	s.pending = map[string]*serviceRecords{}
	s.cur.Store(next)
	s.m.commits.Inc()
	s.m.serial.Set(float64(next.serial))
	s.m.services.Set(float64(len(next.services)))
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// newZone builds the zone after old with changed applied (old nil: the
// empty zone). It shares every unchanged service's records with old.
func (s *Server) newZone(old *zone, changed map[string]*serviceRecords) *zone {
	z := &zone{origin: s.cfg.Zone, services: map[string]*serviceRecords{}, ready: s.ready}
	if old != nil {
		maps.Copy(z.services, old.services)
		z.fp = old.fp
	}
	var removed, added []dns.RR
	for name, sr := range changed {
		r, a := diffServices(z.services[name], sr)
		removed, added = append(removed, r...), append(added, a...)
		if prev := z.services[name]; prev != nil {
			z.fp ^= prev.hash
		}
		if sr == nil {
			delete(z.services, name)
		} else {
			z.services[name] = sr
			z.fp ^= sr.hash
		}
	}
	if old == nil {
		// No views: nothing to derive a serial from. The local clock
		// (as the serial of an empty zone only) puts it above what a
		// previous process's empty zone served.
		z.point = uint64(max(0, time.Now().UnixMilli()/100)) << fpBits
	} else {
		var newest int64
		for _, sr := range z.services {
			newest = max(newest, sr.stamp)
		}
		z.point = nextPoint(old.point, contentPoint(newest, z.fp), z.fp, old.ready)
	}
	z.serial = uint32(z.point)
	ttl := uint32(s.cfg.TTL / time.Second)
	hdr := func(name string, t uint16) dns.RR_Header {
		return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: ttl}
	}
	z.soa = &dns.SOA{Hdr: hdr(s.cfg.Zone, dns.TypeSOA), Ns: s.cfg.Nameservers[0], Mbox: "hostmaster." + s.cfg.Zone,
		Serial: z.serial,
		// Secondaries ask every 60 s when NOTIFY is lost, retry every
		// 10 s, and keep serving their copy for 7 days without muster:
		// the zone's cached view outranks muster's availability.
		Refresh: 60, Retry: 10, Expire: 7 * 24 * 3600, Minttl: ttl}
	z.apex = map[string]rrsets{}
	apex := rrsets{dns.TypeSOA: {z.soa}}
	for _, ns := range s.cfg.Nameservers {
		apex[dns.TypeNS] = append(apex[dns.TypeNS], &dns.NS{Hdr: hdr(s.cfg.Zone, dns.TypeNS), Ns: ns})
		if ns != s.cfg.Zone && inZone(ns, s.cfg.Zone) {
			glue := rrsets{}
			for _, ip := range s.cfg.NameserverAddrs {
				if ip.Is4() || ip.Is4In6() {
					glue[dns.TypeA] = append(glue[dns.TypeA], &dns.A{Hdr: hdr(ns, dns.TypeA), A: ip.Unmap().AsSlice()})
				} else {
					glue[dns.TypeAAAA] = append(glue[dns.TypeAAAA], &dns.AAAA{Hdr: hdr(ns, dns.TypeAAAA), AAAA: ip.AsSlice()})
				}
			}
			z.apex[ns] = glue
		}
	}
	z.apex[s.cfg.Zone] = apex
	z.apex["_muster."+s.cfg.Zone] = rrsets{dns.TypeTXT: {&dns.TXT{Hdr: hdr("_muster."+s.cfg.Zone, dns.TypeTXT), Txt: cachingCaveat}}}
	if len(z.services) > 0 {
		z.apex["_tcp."+s.cfg.Zone] = rrsets{} // the SRV names' empty non-terminal
	}
	if old != nil {
		keep := old.history
		if len(keep) >= s.cfg.History {
			keep = keep[len(keep)-s.cfg.History+1:]
		}
		if s.cfg.History > 0 {
			z.history = append(slices.Clip(keep), diff{from: old.serial, to: z.serial, removed: removed, added: added})
		}
	}
	return z
}

type metrics struct {
	queries    *prometheus.CounterVec
	transfers  *prometheus.CounterVec
	notifies   *prometheus.CounterVec
	commits    prometheus.Counter
	viewErrors prometheus.Counter
	serial     prometheus.Gauge
	services   prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "muster_dns_queries_total",
			Help: "DNS queries answered, by query type and response code."}, []string{"qtype", "rcode"}),
		transfers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "muster_dns_transfers_total",
			Help: "Zone transfer requests, by kind (axfr, ixfr) and result (full, incremental, current, refused)."}, []string{"kind", "result"}),
		notifies: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "muster_dns_notifies_total",
			Help: "NOTIFY messages sent to secondaries, by result (acknowledged, failed)."}, []string{"result"}),
		commits: prometheus.NewCounter(prometheus.CounterOpts{Name: "muster_dns_zone_commits_total",
			Help: "New serials of the DNS zone (each a batch of view changes)."}),
		viewErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "muster_dns_view_errors_total",
			Help: "Views or deltas the DNS zone could not use (the service keeps its previous records)."}),
		serial: prometheus.NewGauge(prometheus.GaugeOpts{Name: "muster_dns_zone_serial", Help: "The DNS zone's SOA serial."}),
		services: prometheus.NewGauge(prometheus.GaugeOpts{Name: "muster_dns_zone_services",
			Help: "Services the DNS zone serves."}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.queries, m.transfers, m.notifies, m.commits, m.viewErrors, m.serial, m.services} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("dns: register metrics: %w", err)
			}
		}
	}
	return m, nil
}
