package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
	"github.com/musterhq/muster/internal/seal"
)

// Member sources (migration 000021): who may supply a service's
// members from each reconciliation source. A Kubernetes Service anywhere
// can carry the annotation naming a muster service, so membership is
// authorised where it enters: each service names the sources (and, for a
// cluster, the namespaces or a label selector on the Kubernetes Service)
// its members may come from. Its owning team's operators or an admin set
// them (PUT /v1/services/{name}/member-sources), every attempt audited as
// member_sources.put, and the row is sealed with the region key in the
// transaction that writes it: a row written by hand authorises nothing
// (MemberAuthorities reports its seal failure, the reconciler alarms it).
//
// A service with no member sources configured takes the defaults of the
// reconciliation config (docs/reconciliation.md): what the source's own
// configuration names for it.

const memberSourcesDomain = "muster member sources seal v1"

// MaxMemberSources bounds the entries of one service's member sources.
const MaxMemberSources = 100

// MemberSource is one place a service's members may come from.
type MemberSource struct {
	// Source is a reconciliation source: k8s/<cluster> or snapshot/<name>.
	Source string `json:"source"`
	// Namespaces, for a Kubernetes source, are the namespaces whose
	// Services may supply members.
	Namespaces []string `json:"namespaces,omitempty"`
	// Selector, for a Kubernetes source, is a label selector the
	// Kubernetes Service must match (with Namespaces, both must hold).
	Selector string `json:"selector,omitempty"`
}

// MemberSources is a service's member sources as stored.
type MemberSources struct {
	Service   string         `json:"service"`
	Version   int64          `json:"version"`
	UpdatedAt *time.Time     `json:"updated_at,omitempty"`
	UpdatedBy string         `json:"updated_by,omitempty"`
	Sources   []MemberSource `json:"sources"`
	// Configured is false for a service that has none: the reconciliation
	// config's defaults apply.
	Configured bool `json:"configured"`
}

// memberSourcesDoc is the stored document.
type memberSourcesDoc struct {
	Sources []MemberSource `json:"sources"`
}

type sealedMemberSources struct {
	Service   string `json:"service"`
	Version   int64  `json:"version"`
	Document  string `json:"document"`
	UpdatedBy string `json:"updated_by"`
	UpdatedAt int64  `json:"updated_at"` // microseconds since the epoch, as stored
}

var sourceName = regexp.MustCompile(`^(k8s|snapshot)/[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidateMemberSources checks a service's member sources.
func ValidateMemberSources(ms []MemberSource) []FieldError {
	var fe []FieldError
	if len(ms) > MaxMemberSources {
		return []FieldError{{Field: "sources", Message: fmt.Sprintf("at most %d entries", MaxMemberSources)}}
	}
	for i, m := range ms {
		f := fmt.Sprintf("sources[%d]", i)
		if !sourceName.MatchString(m.Source) {
			fe = append(fe, FieldError{Field: f + ".source", Message: fmt.Sprintf("%q: want k8s/<cluster> or snapshot/<name>", m.Source)})
			continue
		}
		if strings.HasPrefix(m.Source, SourcePrefixSnapshot) {
			if len(m.Namespaces) > 0 || m.Selector != "" {
				fe = append(fe, FieldError{Field: f, Message: "a snapshot source has no namespaces or selector: name the source alone"})
			}
			continue
		}
		if len(m.Namespaces) == 0 && strings.TrimSpace(m.Selector) == "" {
			fe = append(fe, FieldError{Field: f, Message: "a Kubernetes source needs namespaces, a selector, or both: a cluster as a whole is never authorised"})
		}
		for j, n := range m.Namespaces {
			if !dnsLabel.MatchString(n) {
				fe = append(fe, FieldError{Field: fmt.Sprintf("%s.namespaces[%d]", f, j), Message: fmt.Sprintf("%q is not a namespace name", n)})
			}
		}
		if m.Selector != "" {
			if sel, err := labels.Parse(m.Selector); err != nil {
				fe = append(fe, FieldError{Field: f + ".selector", Message: err.Error()})
			} else if sel.Empty() {
				fe = append(fe, FieldError{Field: f + ".selector", Message: "selects every Service"})
			}
		}
	}
	return fe
}

func memberSourcesSealOf(service string, version int64, doc []byte, by string, at time.Time) sealedMemberSources {
	return sealedMemberSources{Service: service, Version: version, Document: string(doc), UpdatedBy: by, UpdatedAt: at.UnixMicro()}
}

// GetMemberSources returns the service's member sources (Configured false
// when it has none). Anyone who may read the service may read them.
func (r *Registry) GetMemberSources(ctx context.Context, actor identity.Principal, service string) (MemberSources, error) {
	if _, err := r.GetService(ctx, actor, service); err != nil {
		return MemberSources{}, err
	}
	row, err := db.New(r.cfg.Pool).MemberSourcesGet(ctx, service)
	if notFound(err) {
		return MemberSources{Service: service, Sources: []MemberSource{}}, nil
	}
	if err != nil {
		return MemberSources{}, fmt.Errorf("read the member sources of %s: %w", service, err)
	}
	return memberSourcesFrom(row.Service, row.Version, row.Document, row.UpdatedBy, row.UpdatedAt)
}

func memberSourcesFrom(service string, version int64, doc []byte, by string, at time.Time) (MemberSources, error) {
	var d memberSourcesDoc
	if err := json.Unmarshal(doc, &d); err != nil {
		return MemberSources{}, fmt.Errorf("decode the member sources of %s: %w", service, err)
	}
	if d.Sources == nil {
		d.Sources = []MemberSource{}
	}
	return MemberSources{Service: service, Version: version, UpdatedAt: &at, UpdatedBy: by, Sources: d.Sources, Configured: true}, nil
}

// PutMemberSources replaces the service's member sources whole, sealed
// in the same transaction. It needs the owning team's operator role or
// admin; every attempt is audited as member_sources.put, refusals too.
// An empty list is a choice: members come from no reconciliation source.
func (r *Registry) PutMemberSources(ctx context.Context, actor identity.Principal, service string, sources []MemberSource) (MemberSources, error) {
	const action = "member_sources.put"
	asked := memberSourcesDoc{Sources: sources}
	var out MemberSources
	err := r.write(ctx, actor, action, "service", service, asked, func(q *db.Queries) (*refusal.Error, error) {
		row, err := q.ServiceGetForUpdate(ctx, service)
		if notFound(err) {
			return newRefusal(ErrNotFound, "no service named %s", service), nil
		}
		if err != nil {
			return nil, fmt.Errorf("read service %s: %w", service, err)
		}
		if !CanManage(actor, row.Owner) {
			return newRefusal(ErrForbidden, "setting who may supply the members of %s needs the %s team's operator role or admin; %s has neither", service, row.Owner, actor), nil
		}
		if sources == nil {
			return invalid(fmt.Sprintf("the member sources of %s are not valid", service),
				[]FieldError{{Field: "sources", Message: "required: a list, empty to take members from no reconciliation source"}}), nil
		}
		if fe := ValidateMemberSources(sources); len(fe) > 0 {
			return invalid(fmt.Sprintf("the member sources of %s are not valid", service), fe), nil
		}
		var before any
		prev, err := q.MemberSourcesGet(ctx, service)
		switch {
		case err == nil:
			if before, err = memberSourcesFrom(prev.Service, prev.Version, prev.Document, prev.UpdatedBy, prev.UpdatedAt); err != nil {
				return nil, err
			}
		case !notFound(err):
			return nil, fmt.Errorf("read the member sources of %s: %w", service, err)
		}
		doc, err := json.Marshal(asked)
		if err != nil {
			return nil, fmt.Errorf("encode member sources: %w", err)
		}
		now := r.now()
		stored, err := q.MemberSourcesUpsert(ctx, db.MemberSourcesUpsertParams{Service: service, Document: doc, UpdatedBy: actor.String(), Now: now})
		if err != nil {
			return nil, fmt.Errorf("write the member sources of %s: %w", service, err)
		}
		stored, err = seal.Store(ctx, r.cfg.Sealer, memberSourcesDomain, "the member sources of "+service,
			memberSourcesSealOf(stored.Service, stored.Version, stored.Document, stored.UpdatedBy, stored.UpdatedAt), stored,
			func(sig []byte, kid *string) (db.MemberSource, error) {
				return q.MemberSourcesSeal(ctx, db.MemberSourcesSealParams{Service: service, Seal: sig, SealKey: kid})
			})
		if err != nil {
			return nil, err
		}
		if out, err = memberSourcesFrom(stored.Service, stored.Version, stored.Document, stored.UpdatedBy, stored.UpdatedAt); err != nil {
			return nil, err
		}
		_, err = audit.Append(ctx, q, now, accepted(actor, action, "service", service, before, out))
		return nil, err
	})
	if err != nil {
		return MemberSources{}, err
	}
	return out, nil
}

// MemberAuthority is what reconciliation may believe of one registered
// service's member sources.
type MemberAuthority struct {
	// Configured: the service names its member sources (Sources), in a
	// row whose seal verifies.
	Configured bool
	Sources    []MemberSource
	// SealErr is set when the service has a row that does not verify
	// (written outside muster): it authorises nothing, and the service is
	// treated as having none configured.
	SealErr error
}

// MemberAuthorities returns, for each registered service among services,
// its member sources as reconciliation may believe them; services not
// registered are absent from the map.
func (r *Registry) MemberAuthorities(ctx context.Context, services []string) (map[string]MemberAuthority, error) {
	rows, err := db.New(r.cfg.Pool).MemberSourcesListByServices(ctx, services)
	if err != nil {
		return nil, fmt.Errorf("read the member sources of %d services: %w", len(services), err)
	}
	out := make(map[string]MemberAuthority, len(rows))
	for _, row := range rows {
		if row.Version == nil || row.UpdatedBy == nil || row.UpdatedAt == nil {
			out[row.Service] = MemberAuthority{}
			continue
		}
		v := memberSourcesSealOf(row.Service, *row.Version, row.Document, *row.UpdatedBy, *row.UpdatedAt)
		if err := r.trust.For(row.Seal, row.SealKey).Verify(memberSourcesDomain, v, row.Seal, row.SealKey); err != nil {
			out[row.Service] = MemberAuthority{SealErr: err}
			continue
		}
		ms, err := memberSourcesFrom(row.Service, *row.Version, row.Document, *row.UpdatedBy, *row.UpdatedAt)
		if err != nil {
			out[row.Service] = MemberAuthority{SealErr: err}
			continue
		}
		out[row.Service] = MemberAuthority{Configured: true, Sources: ms.Sources}
	}
	return out, nil
}
