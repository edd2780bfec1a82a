package xds

import (
	"hash"
	"hash/fnv"
	"slices"
	"strconv"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// nodeSnapshot is what one principal may see: the resources of the
// services it may resolve. It implements go-control-plane's
// cache.ResourceSnapshot so that the SnapshotCache's watch machinery
// serves it, with muster's versions: each assignment's resource version
// is its view's version, with its peer regions' part when it has one
// (mergeTiers; delta xDS sends a resource only when that changes), and
// each type's state-of-the-world version names the set of (resource,
// version) pairs it holds.
type nodeSnapshot struct {
	resources map[string]map[string]types.ResourceWithTTL // type URL -> name -> resource
	plain     map[string]map[string]types.Resource
	versions  map[string]map[string]string // type URL -> name -> version
	typeVer   map[string]string
}

// typeURLs are the four types muster serves.
var typeURLs = []string{resource.ListenerType, resource.RouteType, resource.ClusterType, resource.EndpointType}

// nodeService is one service a node sees, with its assignment as the
// node sees it.
type nodeService struct {
	*serviceResources
	a *assignment
}

// newNodeSnapshot builds the snapshot of the given services' resources.
func newNodeSnapshot(services []nodeService) *nodeSnapshot {
	s := &nodeSnapshot{
		resources: make(map[string]map[string]types.ResourceWithTTL, len(typeURLs)),
		plain:     make(map[string]map[string]types.Resource, len(typeURLs)),
		versions:  make(map[string]map[string]string, len(typeURLs)),
		typeVer:   make(map[string]string, len(typeURLs)),
	}
	for _, t := range typeURLs {
		s.resources[t] = make(map[string]types.ResourceWithTTL, len(services))
		s.plain[t] = make(map[string]types.Resource, len(services))
		s.versions[t] = make(map[string]string, len(services))
	}
	sorted := slices.Clone(services)
	slices.SortFunc(sorted, func(a, b nodeService) int {
		switch {
		case a.name < b.name:
			return -1
		case a.name > b.name:
			return 1
		}
		return 0
	})
	var newest uint64
	hs := make(map[string]hash.Hash64, len(typeURLs))
	for _, t := range typeURLs {
		hs[t] = fnv.New64a()
	}
	for _, sr := range sorted {
		claVersion := sr.a.version
		newest = max(newest, sr.a.lead)
		for _, t := range typeURLs {
			var r types.Resource
			var v string
			switch t {
			case resource.ListenerType:
				r, v = sr.listener, sr.listenerVersion
			case resource.RouteType:
				r, v = sr.route, sr.routeVersion
			case resource.ClusterType:
				r, v = sr.cluster, sr.clusterVersion
			case resource.EndpointType:
				r, v = sr.a.cla, claVersion
			}
			s.resources[t][sr.name] = types.ResourceWithTTL{Resource: r}
			s.plain[t][sr.name] = r
			s.versions[t][sr.name] = v
			_, _ = hs[t].Write([]byte(sr.name + "\x00" + v + "\x00"))
		}
	}
	for _, t := range typeURLs {
		// The assignments' version leads with the newest view version it
		// holds, for people reading it (and push-latency accounting).
		v := strconv.FormatUint(hs[t].Sum64(), 36) + "." + strconv.Itoa(len(services))
		if t == resource.EndpointType {
			v = strconv.FormatUint(newest, 10) + "." + v
		}
		s.typeVer[t] = v
	}
	return s
}

// GetVersion is the state-of-the-world version of a type.
func (s *nodeSnapshot) GetVersion(typeURL string) string { return s.typeVer[typeURL] }

// GetResourcesAndTTL returns a type's resources (no TTL).
func (s *nodeSnapshot) GetResourcesAndTTL(typeURL string) map[string]types.ResourceWithTTL {
	return s.resources[typeURL]
}

// GetResources returns a type's resources.
func (s *nodeSnapshot) GetResources(typeURL string) map[string]types.Resource {
	return s.plain[typeURL]
}

// ConstructVersionMap does nothing: the versions are built with the
// snapshot.
func (s *nodeSnapshot) ConstructVersionMap() error { return nil }

// GetVersionMap returns each resource's version.
func (s *nodeSnapshot) GetVersionMap(typeURL string) map[string]string { return s.versions[typeURL] }
