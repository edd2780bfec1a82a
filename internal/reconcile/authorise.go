package reconcile

import (
	"cmp"
	"slices"
	"strings"

	"github.com/google/uuid"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/musterhq/muster/internal/registry"
)

// AlarmUnauthorised is raised while a source claims members for a service
// from somewhere the service does not authorise (a Kubernetes Service in
// a namespace its member sources do not name, say).
const AlarmUnauthorised = "reconcile_unauthorised"

// AlarmMemberSourcesUnsealed is raised while a service's member sources
// row does not verify (written outside muster): it authorises nothing.
const AlarmMemberSourcesUnsealed = "member_sources_unsealed"

// Claim is one unauthorised claim of a source: a Kubernetes Service (or
// a snapshot's entries) naming a muster service that does not take
// members from there.
type Claim struct {
	Source      string `json:"source"`
	Namespace   string `json:"namespace,omitempty"`
	KubeService string `json:"kube_service,omitempty"`
	Service     string `json:"service"`
	// Endpoints counts the endpoints claimed; Kept those of them that
	// were members already (admitted before the authority changed): they
	// stay, as they were, until the source stops reporting them.
	Endpoints int `json:"endpoints"`
	Kept      int `json:"kept"`
}

func (c Claim) key() string {
	return c.Source + "\x00" + c.Namespace + "\x00" + c.KubeService + "\x00" + c.Service
}

// Authorise keeps the endpoints of reading r of source that their
// services take members from (auth, by service, from
// registry.MemberAuthorities) and lists the claims that are not.
//
// A service that names member sources takes an endpoint when one of them
// is the source and, for a Kubernetes source, the claiming Kubernetes
// Service's namespace is among its namespaces (when it lists some) and its
// labels match its selector (when it has one). A service that names none
// (or whose row does not verify: it authorises nothing) takes what the
// source's own configuration vouches for (Endpoint.Vouched). An endpoint
// of a service that is not registered is kept: the registry refuses it.
//
// An unauthorised endpoint adds nothing. One that is already a live
// instance (admitted before its service's member sources changed, or
// before the authorisation existed) is kept in the reading, so that
// authorisation never ends capacity; it is counted in its claim as Kept.
func Authorise(source string, r Reading, live []Live, auth map[string]registry.MemberAuthority) (Reading, []Claim) {
	isLive := make(map[uuid.UUID]bool, len(live))
	for _, l := range live {
		isLive[l.ID] = true
	}
	claims := map[string]*Claim{}
	selectors := map[string]labels.Selector{}
	ok := make([]bool, len(r.Endpoints))
	admitted := map[uuid.UUID]bool{}
	for i, e := range r.Endpoints {
		a, known := auth[e.Service]
		if ok[i] = !known || authorised(source, e, a, selectors); ok[i] {
			admitted[e.ID] = true
		}
	}
	out := r
	out.Endpoints = make([]Endpoint, 0, len(r.Endpoints))
	for i, e := range r.Endpoints {
		if ok[i] {
			out.Endpoints = append(out.Endpoints, e)
			continue
		}
		c := Claim{Source: source, Namespace: e.Namespace, KubeService: e.KubeService, Service: e.Service}
		k := c.key()
		if claims[k] == nil {
			claims[k] = &c
		}
		claims[k].Endpoints++
		// A member admitted before is kept, unless an authorised endpoint
		// has its id (two Services reporting one address without a pod
		// reference): the unauthorised copy must never speak for it, say
		// to report it terminating.
		if isLive[e.ID] && !admitted[e.ID] {
			claims[k].Kept++
			out.Endpoints = append(out.Endpoints, e)
		}
	}
	list := make([]Claim, 0, len(claims))
	for _, c := range claims {
		list = append(list, *c)
	}
	slices.SortFunc(list, func(a, b Claim) int { return cmp.Compare(a.key(), b.key()) })
	return out, list
}

func authorised(source string, e Endpoint, a registry.MemberAuthority, selectors map[string]labels.Selector) bool {
	if !a.Configured {
		return e.Vouched
	}
	for _, m := range a.Sources {
		if m.Source != source {
			continue
		}
		if strings.HasPrefix(source, registry.SourcePrefixSnapshot) {
			return true
		}
		if len(m.Namespaces) > 0 && !slices.Contains(m.Namespaces, e.Namespace) {
			continue
		}
		if m.Selector != "" {
			sel, ok := selectors[m.Selector]
			if !ok {
				var err error
				if sel, err = labels.Parse(m.Selector); err != nil {
					sel = labels.Nothing() // validated when written; a bad one selects nothing
				}
				selectors[m.Selector] = sel
			}
			if !sel.Matches(labels.Set(e.Labels)) {
				continue
			}
		}
		if len(m.Namespaces) == 0 && m.Selector == "" {
			continue // never written by muster: a cluster as a whole is never authorised
		}
		return true
	}
	return false
}
