package xds

import (
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strconv"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/musterhq/muster/resolver"
)

// Weight scales: an endpoint's load_balancing_weight is its weight (0,1]
// times endpointScale, at least 1; a locality's is the sum of its
// endpoints' shares (weight × zone traffic weight) times localityScale,
// at least 1, or times fineScale when the assignment splits a zone (see
// Assignment).
const (
	endpointScale = 100
	localityScale = 100
	// fineScale: 1/10,000 of a full-weight endpoint's share, so that a
	// locality of one endpoint at the smallest step (weight 0.1 in a zone
	// at traffic weight 0.1: 100) rounds by at most 0.5%.
	fineScale = 10_000
)

// serviceResources are the four resources of one service, with their
// versions. The listener, route and cluster depend only on the name, and
// their version is a hash of their bytes. The assignment depends on what
// a node may see (its local view, the peer regions whose series it may
// resolve): each variant a node needs is built once per change and
// shared by the nodes that see the same (assignments).
type serviceResources struct {
	name    string
	version uint64 // the local view's; 0 when only peer regions hold the service
	local   *part  // nil: no local view held
	// remote are the peer regions' series of the service held, by region
	// (only regions in Config.Regions).
	remote map[string]*part
	// The listener, route configuration and cluster, encoded once for
	// every node; their version is a hash of their bytes
	// (contentVersion), as go-control-plane names a resource's.
	listener, route, cluster *shared
	// assignments are the assignments built for what nodes see, built
	// when a node's snapshot first needs one. Server.mu held.
	assignments map[access]*assignment
}

type part struct {
	series  string
	version uint64
	cla     *endpoint.ClusterLoadAssignment // Assignment of its view
	share   float64                         // its view's TrafficShare
}

// assignment is a service's ClusterLoadAssignment as some nodes see it.
type assignment struct {
	cla *endpoint.ClusterLoadAssignment
	// version is what muster names it by (mergeTiers); lead the local
	// view's version in it (0: none), for push-latency accounting.
	version string
	lead    uint64
	// shared is it encoded once for every stream sent it.
	shared *shared
}

type access struct {
	local   bool
	regions string
}

func (a access) visible() bool { return a.local || a.regions != "" }

// adsSource is "fetch it on the same ADS stream".
func adsSource() *core.ConfigSource {
	return &core.ConfigSource{
		ResourceApiVersion:    core.ApiVersion_V3,
		ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
	}
}

// deterministicAny packs m with a deterministic encoding (anypb.New's is
// not guaranteed to be), so every replica encodes, hashes and versions the
// same resource alike should a map field ever be set in it.
func deterministicAny(m proto.Message) (*anypb.Any, error) {
	a := &anypb.Any{}
	if err := anypb.MarshalFrom(a, m, proto.MarshalOptions{Deterministic: true}); err != nil {
		return nil, err
	}
	return a, nil
}

// staticResources builds the listener, route configuration and cluster
// of service: all named after it, so a proxyless gRPC client dialling
// xds:///SERVICE finds the listener SERVICE, its route SERVICE, the
// cluster SERVICE and the assignment SERVICE.
func staticResources(service string) (l *listener.Listener, r *route.RouteConfiguration, c *cluster.Cluster, err error) {
	routerCfg, err := deterministicAny(&router.Router{})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("encode router filter: %w", err)
	}
	manager, err := deterministicAny(&hcm.HttpConnectionManager{
		StatPrefix: service,
		RouteSpecifier: &hcm.HttpConnectionManager_Rds{Rds: &hcm.Rds{
			ConfigSource: adsSource(), RouteConfigName: service,
		}},
		HttpFilters: []*hcm.HttpFilter{{
			Name:       "envoy.filters.http.router",
			ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: routerCfg},
		}},
	})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("encode http connection manager: %w", err)
	}
	l = &listener.Listener{Name: service, ApiListener: &listener.ApiListener{ApiListener: manager}}
	r = &route.RouteConfiguration{
		Name: service,
		VirtualHosts: []*route.VirtualHost{{
			Name:    service,
			Domains: []string{"*"},
			Routes: []*route.Route{{
				Match: &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: ""}},
				Action: &route.Route_Route{Route: &route.RouteAction{
					ClusterSpecifier: &route.RouteAction_Cluster{Cluster: service},
				}},
			}},
		}},
	}
	c = &cluster.Cluster{
		Name:                 service,
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
		EdsClusterConfig:     &cluster.Cluster_EdsClusterConfig{EdsConfig: adsSource(), ServiceName: service},
		ConnectTimeout:       durationpb.New(connectTimeout),
		LbPolicy:             cluster.Cluster_ROUND_ROBIN,
		// Envoy weighs localities only when asked to; gRPC always does.
		CommonLbConfig: &cluster.Cluster_CommonLbConfig{
			LocalityConfigSpecifier: &cluster.Cluster_CommonLbConfig_LocalityWeightedLbConfig_{
				LocalityWeightedLbConfig: &cluster.Cluster_CommonLbConfig_LocalityWeightedLbConfig{},
			},
		},
	}
	return l, r, c, nil
}

// contentVersion is go-control-plane's version of a resource: a hash of
// its deterministic encoding.
func contentVersion(r types.Resource) (string, error) {
	b, err := cachev3.MarshalResource(r)
	if err != nil {
		return "", fmt.Errorf("encode %T: %w", r, err)
	}
	return cachev3.HashResource(b), nil
}

// Assignment builds the ClusterLoadAssignment of a snapshot: exactly the
// endpoints the Go resolver routes to (Snapshot.Targets: eligible,
// degraded and health-unknown endpoints, every endpoint of a zone whose
// guard tripped; a drained zone's only when every zone is drained), one
// locality per zone, and one more per endpoint whose weight differs from
// its zone's.
//
// health_status: eligible → HEALTHY, degraded → DEGRADED, health unknown
// → UNKNOWN, and an endpoint the guard republishes although it is
// ineligible or quarantined → UNKNOWN (health disregarded, routable to
// Envoy and gRPC alike). Should no endpoint be HEALTHY or UNKNOWN (every
// target degraded), the degraded ones are published UNKNOWN: gRPC drops
// DEGRADED endpoints, and muster must never be the reason traffic stops.
//
// load_balancing_weight: the endpoint's weight (slow start) × 100, at
// least 1. Envoy honours it, but gRPC clients do not: their round robin
// spreads a locality's traffic evenly over its endpoints, and only the
// locality weights (weighted_target) carry weight. So each zone's
// endpoints at the zone's highest weight stay in the zone's locality
// (sub_zone empty), and every other endpoint (ramping through slow
// start, lowered by an override, degraded at a lower weight) gets a
// locality of its own: same region and zone, sub_zone its instance id.
// Within every locality the endpoints then share one weight, so Envoy
// (locality share × endpoint share) and gRPC (locality share × 1/n) give
// each endpoint the same probability, the resolver's Target.Share over
// the total. A sub-locality is named by the instance rather than by its
// weight so that a ramp step changes its weight and not its name: a
// renamed locality is a new child balancer to gRPC, which would open a
// new connection to the warming instance at every step.
//
// A locality's weight is the sum of its endpoints' shares (weight × the
// zone's traffic weight) × 100, at least 1, so each zone gets the share
// the resolver gives it and a shift-back moves traffic between zones by
// the zone weights. When no zone is split the assignment is exactly what
// it has always been (×100); when one is, every locality is weighted
// × 10,000 (fineScale, lowered only should the sum not fit gRPC's 32
// bits), so that a ramping endpoint's small share is not lost to
// rounding. When every zone is drained the traffic weights are ignored,
// as in the resolver.
func Assignment(s *resolver.Snapshot) *endpoint.ClusterLoadAssignment {
	targets := s.Targets()
	zones := s.Zones()
	routable := false
	for _, t := range targets {
		if h := healthOf(t.Endpoint, zones); h == core.HealthStatus_HEALTHY || h == core.HealthStatus_UNKNOWN {
			routable = true
			break
		}
	}
	type member struct {
		lb *endpoint.LbEndpoint
		t  *resolver.Target
	}
	byZone := map[string][]member{}
	top := map[string]float64{} // each zone's highest weight
	for i := range targets {
		t := &targets[i]
		h := healthOf(t.Endpoint, zones)
		if h == core.HealthStatus_DEGRADED && !routable {
			h = core.HealthStatus_UNKNOWN
		}
		byZone[t.Zone] = append(byZone[t.Zone], member{t: t, lb: &endpoint.LbEndpoint{
			HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
				Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
					Protocol: core.SocketAddress_TCP, Address: t.Address,
					PortSpecifier: &core.SocketAddress_PortValue{PortValue: uint32(t.Port)},
				}}},
			}},
			HealthStatus:        h,
			LoadBalancingWeight: wrapperspb.UInt32(scaled(t.Weight, endpointScale)),
		}})
		top[t.Zone] = max(top[t.Zone], t.Weight)
	}
	names := make([]string, 0, len(byZone))
	for z := range byZone {
		names = append(names, z)
	}
	slices.Sort(names)
	var locs []*endpoint.LocalityLbEndpoints
	var shares []float64 // by locality
	var total float64
	split := false
	for _, z := range names {
		zone := &endpoint.LocalityLbEndpoints{Locality: &core.Locality{Zone: z}}
		var share float64
		var own []*endpoint.LocalityLbEndpoints
		var ownShares []float64
		for _, m := range byZone[z] {
			total += m.t.Share
			if m.t.Weight == top[z] {
				zone.LbEndpoints = append(zone.LbEndpoints, m.lb)
				share += m.t.Share
				continue
			}
			split = true
			own = append(own, &endpoint.LocalityLbEndpoints{
				Locality:    &core.Locality{Zone: z, SubZone: m.t.InstanceID},
				LbEndpoints: []*endpoint.LbEndpoint{m.lb},
			})
			ownShares = append(ownShares, m.t.Share)
		}
		locs = append(append(locs, zone), own...)
		shares = append(append(shares, share), ownShares...)
	}
	scale := float64(localityScale)
	if split {
		// The weights, each rounded up to at least 1, must sum to at most
		// 2^32-1 (gRPC rejects a priority whose weights do not).
		scale = fineScale
		for scale > localityScale && total*scale+float64(len(locs)) > math.MaxUint32 {
			scale /= 10
		}
	}
	cla := &endpoint.ClusterLoadAssignment{ClusterName: s.Service()}
	for i, loc := range locs {
		if split {
			loc.LoadBalancingWeight = wrapperspb.UInt32(uint32(min(max(1, math.Round(shares[i]*scale)), math.MaxUint32)))
		} else {
			loc.LoadBalancingWeight = wrapperspb.UInt32(scaled(shares[i], scale))
		}
		cla.Endpoints = append(cla.Endpoints, loc)
	}
	return cla
}

// healthOf maps an endpoint muster routes to onto an xDS health status.
func healthOf(e resolver.Endpoint, zones map[string]resolver.Zone) core.HealthStatus {
	switch {
	case e.Health == resolver.HealthUnknown:
		return core.HealthStatus_UNKNOWN
	case e.State == resolver.StateIneligible || e.Quarantined:
		// Only here because its zone's guard tripped: health disregarded.
		return core.HealthStatus_UNKNOWN
	case e.State == "degraded":
		return core.HealthStatus_DEGRADED
	case e.State == "eligible":
		return core.HealthStatus_HEALTHY
	}
	return core.HealthStatus_UNKNOWN
}

// scaled is x × scale rounded, clamped to [1, MaxUint32/1024] (gRPC
// requires the sum of a priority's locality weights to fit in 32 bits).
func scaled(x float64, scale float64) uint32 {
	v := math.Round(x * scale)
	if !(v >= 1) {
		return 1
	}
	return uint32(min(v, math.MaxUint32/1024))
}

// Tier is a peer region's view of a service (its remote series
// SERVICE@REGION) for Priorities.
type Tier struct {
	Region   string
	Snapshot *resolver.Snapshot
}

// Priorities builds the ClusterLoadAssignment of service across regions,
// and the version muster names it by: the local view's localities
// (Assignment; locality.region = region when region is not empty) at
// priority 0, then each peer region's, in the order given, at the next
// priority, locality.region its region. A tier with nothing to route to
// takes no priority, so priorities stay contiguous (0, 1, 2 …): a service
// held only by peer regions (local nil) starts at 0. gRPC and Envoy send
// traffic to priority N+1 only when priority N's healthy capacity is
// gone (below its overprovisioning threshold, for Envoy), which is the
// resolver's rule: a remote region only when local capacity is gone.
// See mergeTiers for the version.
func Priorities(service, region string, local *resolver.Snapshot, remotes []Tier) (*endpoint.ClusterLoadAssignment, string) {
	var lt *tier
	if local != nil {
		lt = &tier{region: region, series: service, version: local.Version(), cla: Assignment(local), share: local.TrafficShare()}
	}
	rts := make([]*tier, 0, len(remotes))
	for _, r := range remotes {
		rts = append(rts, &tier{region: r.Region, series: r.Snapshot.Service(), version: r.Snapshot.Version(), cla: Assignment(r.Snapshot), share: r.Snapshot.TrafficShare()})
	}
	cla, version, _ := mergeTiers(service, lt, rts)
	return cla, version
}

// tier is one series' assignment placed at a priority.
type tier struct {
	region  string // locality.region of its endpoints ("" leaves it unset)
	series  string
	version uint64
	cla     *endpoint.ClusterLoadAssignment
	// share is its view's traffic share (resolver.Snapshot.TrafficShare):
	// below 1 while a region drain (or zone drains) hold traffic back.
	share float64
}

// mergeTiers joins the tiers' localities at contiguous priorities (see
// Priorities) and names the result.
//
// The version must be the same on every replica for the same inputs,
// change whenever a series that contributes changes, and be
// today's when no peer region contributes. It is the local view's
// version (0 when the node does not see a local view), and, when a peer
// region's series contributes localities, "." and a hash (FNV-64a,
// base 36) of its (series, version) pairs in priority order: the peers'
// versions are their own, the same on every replica following them, and
// never depend on arrival order. A series with nothing to route to adds
// no localities and is left out of the hash, so equal bytes never carry
// two versions. lead is the local view's version.
func mergeTiers(service string, local *tier, remotes []*tier) (cla *endpoint.ClusterLoadAssignment, version string, lead uint64) {
	if local != nil {
		lead = local.version
	}
	version = strconv.FormatUint(lead, 10)
	// A peer region drained (turned off by the routing control) is no
	// fallback, as for the resolver.
	contributing := slices.DeleteFunc(slices.Clone(remotes), func(t *tier) bool {
		return t == nil || len(t.cla.GetEndpoints()) == 0 || !(t.share > 0)
	})
	if local != nil && local.region == "" && len(contributing) == 0 {
		// Today's assignment, shared as built.
		return local.cla, version, lead
	}
	// This region drained (a region shift: the routing control turned it
	// off, or an admin) while a peer region can take the traffic: the
	// peers come first and the local localities last (still there: never
	// the reason traffic stops); while the drain steps back, priority 0
	// blends the local localities, weighted to the step, with the first
	// peer's, weighted to the rest (ADR-13's capped steps, as the
	// resolver's Pick does).
	if local != nil && local.share < 1 && len(contributing) > 0 && len(local.cla.GetEndpoints()) > 0 {
		if !(local.share > 0) {
			cla, _, _ := mergeTiers(service, nil, contributing)
			priority := uint32(len(distinctPriorities(cla)))
			for _, loc := range local.cla.GetEndpoints() {
				c := proto.Clone(loc).(*endpoint.LocalityLbEndpoints)
				c.Priority = priority
				if local.region != "" {
					c.Locality.Region = local.region
				}
				cla.Endpoints = append(cla.Endpoints, c)
			}
			return cla, version + "." + tiersHash(contributing) + ".drained", lead
		}
		// (region empty: blendLocalities named each locality's region)
		blend := &tier{series: local.series, version: local.version,
			cla: blendLocalities(local, contributing[0]), share: 1}
		cla, _, _ := mergeTiers(service, blend, contributing[1:])
		return cla, version + "." + tiersHash(contributing) + ".share" + strconv.FormatFloat(local.share, 'g', 4, 64), lead
	}
	cla = &endpoint.ClusterLoadAssignment{ClusterName: service}
	priority := uint32(0)
	add := func(t *tier) {
		if t == nil || len(t.cla.GetEndpoints()) == 0 {
			return
		}
		for _, loc := range t.cla.GetEndpoints() {
			c := proto.Clone(loc).(*endpoint.LocalityLbEndpoints)
			c.Priority = priority
			if t.region != "" {
				c.Locality.Region = t.region
			}
			cla.Endpoints = append(cla.Endpoints, c)
		}
		priority++
	}
	add(local)
	if len(contributing) == 0 {
		return cla, version, lead
	}
	for _, t := range contributing {
		add(t)
	}
	return cla, version + "." + tiersHash(contributing), lead
}

// tiersHash is FNV-64a, base 36, of the tiers' (series, version) pairs in
// order.
func tiersHash(tiers []*tier) string {
	h := fnv.New64a()
	for _, t := range tiers {
		_, _ = h.Write([]byte(t.series + "\x00" + strconv.FormatUint(t.version, 10) + "\x00"))
	}
	return strconv.FormatUint(h.Sum64(), 36)
}

// distinctPriorities lists the priorities cla's localities use.
func distinctPriorities(cla *endpoint.ClusterLoadAssignment) []uint32 {
	var out []uint32
	for _, loc := range cla.GetEndpoints() {
		if !slices.Contains(out, loc.GetPriority()) {
			out = append(out, loc.GetPriority())
		}
	}
	return out
}

// blendLocalities is one priority holding local's localities and peer's,
// their locality weights scaled so that local's sum to local.share of the
// whole and peer's to the rest: to about blendScale together, or
// fineBlendScale when either holds a locality of its own for an endpoint
// (a ramping endpoint's locality may hold a ten-thousandth of the
// weight, which blendScale would round to 1).
func blendLocalities(local, peer *tier) *endpoint.ClusterLoadAssignment {
	out := &endpoint.ClusterLoadAssignment{ClusterName: local.cla.GetClusterName()}
	scale := float64(blendScale)
	for _, t := range []*tier{local, peer} {
		for _, loc := range t.cla.GetEndpoints() {
			if loc.GetLocality().GetSubZone() != "" {
				scale = fineBlendScale
			}
		}
	}
	add := func(t *tier, part float64) {
		var total float64
		for _, loc := range t.cla.GetEndpoints() {
			total += float64(loc.GetLoadBalancingWeight().GetValue())
		}
		for _, loc := range t.cla.GetEndpoints() {
			c := proto.Clone(loc).(*endpoint.LocalityLbEndpoints)
			c.Priority = 0
			if t.region != "" && c.Locality != nil {
				c.Locality.Region = t.region
			}
			w := 1.0
			if total > 0 {
				w = float64(loc.GetLoadBalancingWeight().GetValue()) / total
			}
			c.LoadBalancingWeight = wrapperspb.UInt32(max(1, uint32(math.Round(w*part*scale))))
			out.Endpoints = append(out.Endpoints, c)
		}
	}
	add(local, local.share)
	add(peer, 1-local.share)
	return out
}

// blendScale is what the blended locality weights of one priority sum to
// (about): fine enough for the steps' shares.
const blendScale = 10_000

// fineBlendScale is blendScale for blends that hold endpoints' own
// localities: 10^9, which with each locality's rounding up to 1 leaves
// room for 3×10^9 localities below gRPC's 2^32-1.
const fineBlendScale = 1_000_000_000
