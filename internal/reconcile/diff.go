package reconcile

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"
	"strconv"

	"github.com/google/uuid"
)

// DiffKind is a kind of divergence between the sources and the registry.
type DiffKind string

// The kinds of divergence (ADR-03's reconciliation diff).
const (
	// DiffMissing: the source has it, the registry lacks it (a startup
	// failure: never ready; or a creation the registry refused).
	DiffMissing DiffKind = "missing"
	// DiffLeak: the registry has a live instance of a reconciled service
	// that no source knows (a registration leak; a process that died
	// without deregistering and still renews; an instance of a source no
	// longer configured).
	DiffLeak DiffKind = "leak"
	// DiffMismatch: both have it, and they disagree (address, port, zone).
	DiffMismatch DiffKind = "mismatch"
	// DiffHeld: the source no longer reports it, and the disbelief
	// threshold holds its removal.
	DiffHeld DiffKind = "held"
)

// DiffKinds lists the kinds in the order the diff reports them.
var DiffKinds = []DiffKind{DiffMissing, DiffLeak, DiffMismatch, DiffHeld}

// DiffItem is one divergence.
type DiffItem struct {
	Kind    DiffKind `json:"kind"`
	Source  string   `json:"source"`
	Service string   `json:"service"`
	// Instance is the registry's (or derived) instance id.
	Instance uuid.UUID `json:"instance_id"`
	Key      string    `json:"key,omitempty"`
	Address  string    `json:"address"`
	Port     int       `json:"port"`
	Zone     string    `json:"zone"`
	Detail   string    `json:"detail"`
}

// SourceView is what the diff needs of one source: its last reading and
// what the last pass decided.
type SourceView struct {
	Name    string
	Reading Reading
	Plan    Plan
	// Skipped are creations the registry refused, by id, with why.
	Skipped map[uuid.UUID]string
	// Services are the services the source covers: those of its reading
	// and of its live instances.
	Services []string
}

// Registered is a live instance in the registry, of any source.
type Registered struct {
	Live
	Source string
}

type endpointKey struct {
	service, address string
	port             int
}

// DiffOf compares the sources' readings with the registry's live
// instances of the services they cover (of any source), and lists each
// divergence, ordered by source, service, kind and address.
func DiffOf(sources []SourceView, live []Registered) []DiffItem {
	var out []DiffItem
	liveBy := make(map[uuid.UUID]Registered, len(live))
	for _, l := range live {
		liveBy[l.ID] = l
	}
	known := map[endpointKey]bool{}
	names := map[string]SourceView{}
	reported := map[string]map[uuid.UUID]bool{} // by source
	for _, s := range sources {
		names[s.Name] = s
		ids := make(map[uuid.UUID]bool, len(s.Reading.Endpoints))
		for _, e := range s.Reading.Endpoints {
			ids[e.ID] = true
		}
		reported[s.Name] = ids
		unready := map[uuid.UUID]bool{}
		for _, e := range s.Plan.Unready {
			unready[e.ID] = true
		}
		seen := map[uuid.UUID]bool{}
		for _, e := range s.Reading.Endpoints {
			known[endpointKey{e.Service, e.Address, e.Port}] = true
			if seen[e.ID] {
				continue
			}
			seen[e.ID] = true
			item := DiffItem{Source: s.Name, Service: e.Service, Instance: e.ID, Key: e.Key, Address: e.Address, Port: e.Port, Zone: e.Zone}
			if l, ok := liveBy[e.ID]; ok {
				var what []string
				if l.Address != e.Address || l.Port != e.Port {
					what = append(what, fmt.Sprintf("address %s in the registry, %s in %s", hostPort(l.Address, l.Port), hostPort(e.Address, e.Port), s.Name))
				}
				if l.Zone != e.Zone {
					what = append(what, fmt.Sprintf("zone %s in the registry, %s in %s", l.Zone, e.Zone, s.Name))
				}
				if len(what) > 0 {
					item.Kind, item.Detail = DiffMismatch, joinSemi(what)
					out = append(out, item)
				}
				continue
			}
			if e.Terminating && !e.Serving {
				continue // leaving, by the source's own word
			}
			item.Kind = DiffMissing
			switch why, skipped := s.Skipped[e.ID]; {
			case skipped:
				item.Detail = "the registry refused it: " + why
			case unready[e.ID]:
				item.Detail = fmt.Sprintf("in %s but never ready since it appeared: a startup failure (it has never reported ready)", s.Name)
			default:
				item.Detail = "not applied yet: the next pass adds it"
			}
			out = append(out, item)
		}
	}
	held := map[uuid.UUID]string{}
	for _, s := range sources {
		for _, id := range s.Plan.Held {
			held[id] = s.Name
		}
	}
	for _, l := range live {
		item := DiffItem{Source: l.Source, Service: l.Service, Instance: l.ID, Address: l.Address, Port: l.Port, Zone: l.Zone}
		_, reconciled := names[l.Source]
		switch {
		case held[l.ID] != "":
			item.Kind = DiffHeld
			item.Detail = fmt.Sprintf("%s no longer reports it; the disbelief threshold holds its removal until a second reading after the dwell or an operator confirms", held[l.ID])
		case reconciled:
			if reported[l.Source][l.ID] {
				continue
			}
			item.Kind, item.Detail = DiffLeak, fmt.Sprintf("%s no longer reports it", l.Source)
		case known[endpointKey{l.Service, l.Address, l.Port}]:
			continue // registered, and a source has the endpoint: replaced at the next pass
		case l.Source == "registered":
			item.Kind, item.Detail = DiffLeak, "registered, and unknown to every source reconciling "+l.Service+": a registration leak"
		default:
			item.Kind, item.Detail = DiffLeak, fmt.Sprintf("from %s, which is not a configured source", l.Source)
		}
		out = append(out, item)
	}
	slices.SortFunc(out, func(a, b DiffItem) int {
		return cmp.Or(cmp.Compare(a.Source, b.Source), cmp.Compare(a.Service, b.Service),
			cmp.Compare(slices.Index(DiffKinds, a.Kind), slices.Index(DiffKinds, b.Kind)),
			cmp.Compare(a.Address, b.Address), cmp.Compare(a.Port, b.Port), bytes.Compare(a.Instance[:], b.Instance[:]))
	})
	return out
}

func hostPort(a string, p int) string { return a + ":" + strconv.Itoa(p) }

func joinSemi(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += "; "
		}
		out += x
	}
	return out
}
