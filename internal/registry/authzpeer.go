package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/musterhq/muster/db"
)

// ErrNoSnapshot means the copy of services and grants has not read any
// rows yet, so it has none to hand a peer.
var ErrNoSnapshot = errors.New("the copy of services and grants holds no rows yet")

// The rows of services and grants as one replica hands them to another
// (GET /v1/peer/authz: a replica that starts while PostgreSQL
// is unreachable takes its authorisation copy from a peer). They are the
// rows as read from PostgreSQL, seals included, and the receiver verifies
// every seal with its own keys, as it would rows read from the database:
// a peer can withhold rows, but cannot make the receiver believe a row
// muster did not seal.
type authzSnapshot struct {
	Services     []authzServiceRow `json:"services"`
	Grants       []authzGrantRow   `json:"grants"`
	ConfirmedAt  time.Time         `json:"confirmed_at,omitzero"`
	Confirmation string            `json:"confirmed_by,omitempty"`
}

type authzServiceRow struct {
	Name         string    `json:"name"`
	Owner        string    `json:"owner"`
	Capabilities []string  `json:"capabilities"`
	CreatedAt    time.Time `json:"created_at"`
	UpdatedAt    time.Time `json:"updated_at"`
	Seal         []byte    `json:"seal"`
	SealKey      *string   `json:"seal_key"`
}

type authzGrantRow struct {
	Service   string     `json:"service"`
	Caller    string     `json:"caller"`
	GrantedAt time.Time  `json:"granted_at"`
	GrantedBy string     `json:"granted_by"`
	Version   int64      `json:"version"`
	RevokedAt *time.Time `json:"revoked_at"`
	RevokedBy *string    `json:"revoked_by"`
	Seal      []byte     `json:"seal"`
	SealKey   *string    `json:"seal_key"`
}

// Snapshot encodes the rows the copy last read (from PostgreSQL, or from
// a peer while the database was unreachable), for a peer replica.
func (c *AuthzCache) Snapshot() ([]byte, error) {
	c.mu.RLock()
	rows, ok := c.rows, c.hasRows
	c.mu.RUnlock()
	if !ok {
		return nil, ErrNoSnapshot
	}
	s := authzSnapshot{Services: make([]authzServiceRow, len(rows.services)), Grants: make([]authzGrantRow, len(rows.grants)),
		ConfirmedAt: rows.confirmedAt, Confirmation: rows.confirmation}
	for i, r := range rows.services {
		s.Services[i] = authzServiceRow(r)
	}
	for i, r := range rows.grants {
		s.Grants[i] = authzGrantRow(r)
	}
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encode services and grants: %w", err)
	}
	return b, nil
}

// LoadSnapshot applies rows a peer handed over (Snapshot's encoding) as a
// reload from PostgreSQL would be applied: every seal is verified with
// this replica's keys, unsealed rows are not believed, a row gone is kept,
// and only a sealed tombstone revokes. It is used only while the copy
// cannot be read from the database; once it has been (Start's loop),
// LoadSnapshot refuses, so a peer never overrides the database.
func (c *AuthzCache) LoadSnapshot(b []byte) error {
	var s authzSnapshot
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("decode services and grants: %w", err)
	}
	rows := authzRows{services: make([]db.Service, len(s.Services)), grants: make([]db.ServiceGrant, len(s.Grants)),
		confirmedAt: s.ConfirmedAt, confirmation: s.Confirmation}
	for i, r := range s.Services {
		rows.services[i] = db.Service(r)
	}
	for i, r := range s.Grants {
		rows.grants[i] = db.ServiceGrant(r)
	}
	r := c.cfg.Registry
	r.serviceSeals.Next()
	rows.serviceErrs = make([]error, len(rows.services))
	for i, row := range rows.services {
		rows.serviceErrs[i] = r.verifyService(row)
	}
	r.grantSeals.Next()
	rows.grantErrs = make([]error, len(rows.grants))
	for i, row := range rows.grants {
		rows.grantErrs[i] = r.verifyGrant(row)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dbLoaded {
		return errors.New("the copy of services and grants is read from the database now; a peer's is not taken")
	}
	c.apply(rows)
	c.rows, c.hasRows = rows, true
	return nil
}
