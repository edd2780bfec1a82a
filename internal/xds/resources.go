package xds

import (
	"fmt"
	"math"
	"slices"

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
// times endpointScale, at least 1; a locality's is its zone's traffic
// weight times localityScale times the zone's total endpoint weight, at
// least 1.
const (
	endpointScale = 100
	localityScale = 100
)

// serviceResources are the four resources of one service, with their
// versions: the assignment's is the view's version; the other three
// depend only on the name, and their version is a hash of their bytes.
type serviceResources struct {
	name     string
	version  uint64 // the view's
	listener types.Resource
	route    types.Resource
	cluster  types.Resource
	cla      types.Resource
	// The listener's, route's and cluster's versions: go-control-plane's
	// hash of their bytes (what delta xDS sends as their version).
	listenerVersion, routeVersion, clusterVersion string
	// claHash is that hash of the assignment; delta responses carry the
	// view version instead (Server.deltaVersions).
	claHash string
}

// adsSource is "fetch it on the same ADS stream".
func adsSource() *core.ConfigSource {
	return &core.ConfigSource{
		ResourceApiVersion:    core.ApiVersion_V3,
		ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
	}
}

// deterministicAny packs m with a deterministic encoding (anypb.New's is
// not guaranteed to be), so every replica encodes, hashes and versions the
// same resource alike should a map field ever be set in it (issue 27).
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
// locality per zone.
//
// health_status: eligible → HEALTHY, degraded → DEGRADED, health unknown
// → UNKNOWN, and an endpoint the guard republishes although it is
// ineligible or quarantined → UNKNOWN (health disregarded, routable to
// Envoy and gRPC alike). Should no endpoint be HEALTHY or UNKNOWN (every
// target degraded), the degraded ones are published UNKNOWN: gRPC drops
// DEGRADED endpoints, and muster must never be the reason traffic stops.
//
// load_balancing_weight: the endpoint's weight (slow start) × 100, at
// least 1. A locality's weight is its zone's traffic weight × 100 × the
// zone's total endpoint weight (at least 1), so each zone gets the share
// the resolver gives it (Target.Share summed over the zone), and a
// shift-back moves traffic between zones by the zone weights. When every
// zone is drained the traffic weights are ignored, as in the resolver.
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
	byZone := map[string]*endpoint.LocalityLbEndpoints{}
	share := map[string]float64{}
	for _, t := range targets {
		loc := byZone[t.Zone]
		if loc == nil {
			loc = &endpoint.LocalityLbEndpoints{Locality: &core.Locality{Zone: t.Zone}}
			byZone[t.Zone] = loc
		}
		h := healthOf(t.Endpoint, zones)
		if h == core.HealthStatus_DEGRADED && !routable {
			h = core.HealthStatus_UNKNOWN
		}
		loc.LbEndpoints = append(loc.LbEndpoints, &endpoint.LbEndpoint{
			HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
				Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
					Protocol: core.SocketAddress_TCP, Address: t.Address,
					PortSpecifier: &core.SocketAddress_PortValue{PortValue: uint32(t.Port)},
				}}},
			}},
			HealthStatus:        h,
			LoadBalancingWeight: wrapperspb.UInt32(scaled(t.Weight, endpointScale)),
		})
		share[t.Zone] += t.Share
	}
	names := make([]string, 0, len(byZone))
	for z := range byZone {
		names = append(names, z)
	}
	slices.Sort(names)
	cla := &endpoint.ClusterLoadAssignment{ClusterName: s.Service()}
	for _, z := range names {
		loc := byZone[z]
		loc.LoadBalancingWeight = wrapperspb.UInt32(scaled(share[z], localityScale))
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
