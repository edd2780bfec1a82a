package xds

import (
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// nodeSnapshot is what one principal may see: the resources of the
// services it may resolve, each shared with every node that sees it
// alike (an assignment's version is its view's version, with its peer
// regions' part when it has one: mergeTiers). The watchCache answers the
// node's streams from it.
type nodeSnapshot struct {
	resources map[string]map[string]*shared // type URL -> name -> resource
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
	s := &nodeSnapshot{resources: make(map[string]map[string]*shared, len(typeURLs))}
	for _, t := range typeURLs {
		s.resources[t] = make(map[string]*shared, len(services))
	}
	for _, sr := range services {
		s.resources[resource.ListenerType][sr.name] = sr.listener
		s.resources[resource.RouteType][sr.name] = sr.route
		s.resources[resource.ClusterType][sr.name] = sr.cluster
		s.resources[resource.EndpointType][sr.name] = sr.a.shared
	}
	return s
}
