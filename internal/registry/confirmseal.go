package registry

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/seal"
)

// Confirmations release what muster holds back from removing: a mass
// lease expiry (lease_expiry_confirmations), a reconciliation source's
// absences (reconcile_confirmations), a reload of services and grants
// that lost rows (authz_reload_confirmations). The API gives one only to
// someone with the authority, rate-limited and audited; a row inserted by
// hand would skip all of that and release the holds anyway. So muster
// seals each confirmation as it writes it, over every field that decides
// what it releases, and believes only those whose seal verifies. A row
// that does not verify is ignored (the hold stays: nothing is removed),
// logged once, counted and alarmed as confirmation_unsealed.
//
// Copying a sealed row gains a forger nothing: its confirmed_at is sealed,
// and a confirmation releases only holds that began before it.
const (
	leaseConfirmationDomain     = "lease-expiry-confirmation.v1"
	reconcileConfirmationDomain = "reconcile-confirmation.v1"
	authzConfirmationDomain     = "authz-reload-confirmation.v1"

	// AlarmConfirmationUnsealed names a confirmation row muster did not
	// write as it stands.
	AlarmConfirmationUnsealed = "confirmation_unsealed"
	// confirmationDoubtFor is how long such a row stays alarmed after it
	// was last read (the readers read only recent rows, so an old forgery
	// stops being read and its alarm ends).
	confirmationDoubtFor = 10 * time.Minute
)

type sealedLeaseConfirmation struct {
	Scope       string `json:"scope"`
	ConfirmedAt int64  `json:"confirmed_at"` // microseconds since the epoch, as stored
	ConfirmedBy string `json:"confirmed_by"`
	Reason      string `json:"reason"`
}

type sealedReconcileConfirmation struct {
	Source      string      `json:"source"`
	ConfirmedAt int64       `json:"confirmed_at"`
	ConfirmedBy string      `json:"confirmed_by"`
	Reason      string      `json:"reason"`
	Instances   []uuid.UUID `json:"instances"`
}

type sealedAuthzConfirmation struct {
	ConfirmedAt int64  `json:"confirmed_at"`
	ConfirmedBy string `json:"confirmed_by"`
	Reason      string `json:"reason"`
}

func leaseConfirmationSealOf(scope string, at time.Time, by, reason string) sealedLeaseConfirmation {
	return sealedLeaseConfirmation{Scope: scope, ConfirmedAt: at.UnixMicro(), ConfirmedBy: by, Reason: reason}
}

func reconcileConfirmationSealOf(source string, at time.Time, by, reason string, ids []uuid.UUID) sealedReconcileConfirmation {
	if ids == nil {
		ids = []uuid.UUID{}
	}
	return sealedReconcileConfirmation{Source: source, ConfirmedAt: at.UnixMicro(), ConfirmedBy: by, Reason: reason, Instances: ids}
}

func authzConfirmationSealOf(at time.Time, by, reason string) sealedAuthzConfirmation {
	return sealedAuthzConfirmation{ConfirmedAt: at.UnixMicro(), ConfirmedBy: by, Reason: reason}
}

// sealConfirmation signs v in domain with the registry's Sealer (none:
// unsealed, as every row of a keyless region).
func (r *Registry) sealConfirmation(ctx context.Context, domain string, v any) ([]byte, *string, error) {
	if r.cfg.Sealer == nil {
		return nil, nil, nil
	}
	sig, kid, err := seal.Sign(ctx, r.cfg.Sealer, domain, v)
	if err != nil {
		return nil, nil, fmt.Errorf("seal the confirmation: %w", err)
	}
	return sig, &kid, nil
}

// believeConfirmation checks a confirmation row's seal and records a
// doubt when it fails.
func (r *Registry) believeConfirmation(table string, id int64, domain string, v any, sig []byte, kid *string) bool {
	err := r.trust.For(sig, kid).Verify(domain, v, sig, kid)
	if err == nil {
		return true
	}
	r.confirmDoubts.note(r, table, id, err)
	return false
}

func (r *Registry) believeLeaseConfirmation(c db.LeaseExpiryConfirmation) bool {
	return r.believeConfirmation("lease_expiry_confirmations", c.ID, leaseConfirmationDomain,
		leaseConfirmationSealOf(c.Scope, c.ConfirmedAt, c.ConfirmedBy, c.Reason), c.Seal, c.SealKey)
}

func (r *Registry) believeReconcileConfirmation(c db.ReconcileConfirmation) bool {
	return r.believeConfirmation("reconcile_confirmations", c.ID, reconcileConfirmationDomain,
		reconcileConfirmationSealOf(c.Source, c.ConfirmedAt, c.ConfirmedBy, c.Reason, c.Instances), c.Seal, c.SealKey)
}

func (r *Registry) believeAuthzConfirmation(c db.AuthzReloadConfirmation) bool {
	return r.believeConfirmation("authz_reload_confirmations", c.ID, authzConfirmationDomain,
		authzConfirmationSealOf(c.ConfirmedAt, c.ConfirmedBy, c.Reason), c.Seal, c.SealKey)
}

// confirmationDoubts are the confirmation rows not believed, by table and
// id, with when each was first and last read.
type confirmationDoubts struct {
	mu      sync.Mutex
	rows    map[string]confirmationDoubt
	counter *prometheus.CounterVec
}

type confirmationDoubt struct {
	table       string
	id          int64
	reason      string
	since, last time.Time
}

func (d *confirmationDoubts) note(r *Registry, table string, id int64, err error) {
	now := r.cfg.Now()
	key := fmt.Sprintf("%s/%d", table, id)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.rows == nil {
		d.rows = map[string]confirmationDoubt{}
	}
	old, seen := d.rows[key]
	if !seen {
		old = confirmationDoubt{table: table, id: id, reason: err.Error(), since: now}
		r.cfg.Logger.Warn("a confirmation is not muster's as it stands: it releases nothing",
			"table", table, "id", id, "reason", err.Error())
		if d.counter != nil {
			d.counter.WithLabelValues(table).Inc()
		}
	}
	old.last = now
	d.rows[key] = old
}

// ConfirmationAlarms lists confirmation_unsealed per confirmation row read
// within the last ten minutes whose seal did not verify.
func (r *Registry) ConfirmationAlarms() []assembler.Alarm {
	d := &r.confirmDoubts
	now := r.cfg.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []assembler.Alarm
	for k, c := range d.rows {
		if now.Sub(c.last) > confirmationDoubtFor {
			delete(d.rows, k)
			continue
		}
		out = append(out, assembler.Alarm{Kind: AlarmConfirmationUnsealed, Since: c.since,
			Detail: fmt.Sprintf("%s row %d is not muster's as it stands (%s), so it releases nothing; the table was written outside muster (give the confirmation again through the API if it was wanted)",
				c.table, c.id, c.reason)})
	}
	slices.SortFunc(out, func(a, b assembler.Alarm) int { return strings.Compare(a.Detail, b.Detail) })
	return out
}
