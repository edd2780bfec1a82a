package ownership

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/seal"
)

// Sealed membership. Whom a replica follows (the relay), deals shards to
// (the balance), forwards evidence to and counts in the census is this
// package's reading of table replicas, which anyone who can write the
// database can write: one row with last_seen ahead and an address of the
// writer's choosing would be followed by every replica and dealt shards.
// So each replica seals its own row's identity (id, address, region and
// its incarnation, a random name of the process) with the region's key
// when it starts, and the reading believes a row only when its seal
// verifies. last_seen and ready change every round and are not sealed:
// the worst a writer can do with them is keep a dead replica's sealed
// row live, and a replica that never takes what it is dealt is dealt
// nothing for a minute (Config.OfferTimeout, UnresponsiveFor).
//
// A row that is not believed is left out of Region().Replicas (so of
// every reader's list), listed under Region().Unbelieved, logged once,
// counted in muster_replicas_unbelieved{reason} and raised as
// replica_unsealed (or replica_insecure_address).

// AlarmReplicaUnsealed is raised per row of table replicas that is not
// believed because its seal does not verify: unsealed (written by hand,
// or by a release that does not seal, outside upgrade mode), sealed by a
// key this replica does not trust, or changed since it was sealed.
const AlarmReplicaUnsealed = "replica_unsealed"

// AlarmReplicaInsecureAddress is raised per row of table replicas that is
// not believed because its address is plain http on a host that is not
// loopback (without Config.AllowHTTP): a peer there would be followed and
// sent evidence in clear, where anyone on the path can rewrite it.
const AlarmReplicaInsecureAddress = "replica_insecure_address"

// Why a row is not believed (muster_replicas_unbelieved's reason).
const (
	UnbelievedUnsealed   = "unsealed"
	UnbelievedUnknownKey = "unknown_key"
	UnbelievedBadSeal    = "bad_seal"
	UnbelievedInsecure   = "insecure_address"
)

var unbelievedReasons = []string{UnbelievedUnsealed, UnbelievedUnknownKey, UnbelievedBadSeal, UnbelievedInsecure}

// memberDomain is the seal domain of a replicas row.
const memberDomain = "muster replica seal v1"

// memberSeal is what a replicas row's seal covers: who the replica is
// and where it is reached, not how recently it said so.
type memberSeal struct {
	ID          string `json:"id"`
	Address     string `json:"address"`
	Region      string `json:"region"`
	Incarnation string `json:"incarnation"`
}

// UnbelievedReplica is a live row of table replicas this replica does not
// believe: it is not followed, dealt shards, sent evidence or counted.
type UnbelievedReplica struct {
	ID       string    `json:"id"`
	Address  string    `json:"address"`
	Region   string    `json:"region,omitempty"`
	LastSeen time.Time `json:"last_seen"`
	// Reason: unsealed, unknown_key, bad_seal or insecure_address.
	Reason string `json:"reason"`
	Detail string `json:"detail"`
	// Since is when (local clock) this replica first read the row so.
	Since time.Time `json:"since"`
}

func newIncarnation() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// sealOwn seals this replica's identity, once per process: the seal does
// not change with the heartbeat, so a KMS is asked once.
func (m *Manager) sealOwn(ctx context.Context) (sig []byte, keyID *string, err error) {
	if m.cfg.Sealer == nil {
		return nil, nil, nil
	}
	if m.ownSeal != nil {
		return m.ownSeal, m.ownKey, nil
	}
	s, kid, err := seal.Sign(ctx, m.cfg.Sealer, memberDomain, memberSeal{ID: m.cfg.ID, Address: m.cfg.Address, Region: m.cfg.Region, Incarnation: m.incarnation})
	if err != nil {
		return nil, nil, fmt.Errorf("seal the row of replica %s: %w", m.cfg.ID, err)
	}
	m.ownSeal, m.ownKey = s, &kid
	return s, &kid, nil
}

// believe splits the live rows into those believed (with whether each is
// sealed) and those not, and records the latter for the alarms, logging
// each row once.
func (m *Manager) believe(now time.Time, rows []db.Replica) ([]db.Replica, map[string]bool) {
	var believed []db.Replica
	sealed := map[string]bool{}
	var out []UnbelievedReplica
	for _, r := range rows {
		reason, detail := m.judgeRow(r)
		if reason == "" {
			believed = append(believed, r)
			sealed[r.ID] = len(r.Seal) > 0 && len(m.trustKeys()) > 0
			continue
		}
		out = append(out, UnbelievedReplica{ID: r.ID, Address: r.Address, Region: r.Region, LastSeen: r.LastSeen, Reason: reason, Detail: detail})
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	prev := m.unbelieved
	m.unbelieved = map[string]UnbelievedReplica{}
	counts := map[string]int{}
	for _, u := range out {
		if p, ok := prev[u.ID]; ok && p.Reason == u.Reason && p.Address == u.Address {
			u.Since = p.Since
		} else {
			u.Since = now
			m.log.Warn("a row of table replicas is not believed: it is not followed, dealt shards, sent evidence or counted",
				"replica", u.ID, "address", u.Address, "reason", u.Reason, "detail", u.Detail)
		}
		m.unbelieved[u.ID] = u
		counts[u.Reason]++
	}
	for _, r := range unbelievedReasons {
		m.met.unbelieved.WithLabelValues(r).Set(float64(counts[r]))
	}
	return believed, sealed
}

func (m *Manager) trustKeys() seal.Keys {
	if m.cfg.Trust == nil {
		return nil
	}
	return m.cfg.Trust.Keys()
}

// judgeRow says why row r is not believed ("" when it is).
func (m *Manager) judgeRow(r db.Replica) (reason, detail string) {
	keys := m.cfg.Trust.For(r.Seal, r.SealKey)
	inc := ""
	if r.Incarnation != nil {
		inc = *r.Incarnation
	}
	if len(r.Seal) == 0 && len(keys) > 0 && m.cfg.BelieveUnsealed {
		// Upgrade mode: a replica of the release before seals nothing.
		keys = nil
	}
	err := keys.Verify(memberDomain, memberSeal{ID: r.ID, Address: r.Address, Region: r.Region, Incarnation: inc}, r.Seal, r.SealKey)
	switch {
	case errors.Is(err, seal.ErrUnsealed):
		return UnbelievedUnsealed, "the row is not sealed by muster (written by hand, or by a release that does not seal rows: MUSTER_PEER_TRUST=upgrade believes those during a rolling upgrade)"
	case errors.Is(err, seal.ErrUnknownKey):
		return UnbelievedUnknownKey, err.Error()
	case err != nil:
		return UnbelievedBadSeal, "the row's seal does not match it: its id, address, region or incarnation was changed outside muster"
	}
	// Replicas exchange nothing without the region's key (relaying and
	// forwarding are off), so an address carries nothing to protect.
	if m.cfg.Sealer != nil && !m.cfg.AllowHTTP && r.ID != m.cfg.ID && InsecureURL(r.Address) {
		return UnbelievedInsecure, "its address is plain http on a host that is not loopback: it would be followed and sent evidence in clear (MUSTER_PEER_ALLOW_HTTP=true allows it in a lab)"
	}
	return "", ""
}

// InsecureURL reports whether base is a plain-http URL whose host is not
// loopback (localhost, 127.0.0.0/8, ::1): what a replica may reach a peer
// at only with MUSTER_PEER_ALLOW_HTTP. An address that does not parse is
// insecure too.
func InsecureURL(base string) bool {
	u, err := url.Parse(base)
	if err != nil {
		return true
	}
	switch strings.ToLower(u.Scheme) {
	case "https":
		return false
	case "http":
	default:
		return true
	}
	host := strings.ToLower(u.Hostname())
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return false
	}
	ip := net.ParseIP(host)
	return ip == nil || !ip.IsLoopback()
}

// Unbelieved lists the live rows not believed at the last reading, by id.
func (m *Manager) Unbelieved() []UnbelievedReplica {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := slices.Collect(maps.Values(m.unbelieved))
	slices.SortFunc(out, func(a, b UnbelievedReplica) int { return strings.Compare(a.ID, b.ID) })
	if out == nil {
		out = []UnbelievedReplica{}
	}
	return out
}

// unbelievedAlarms are replica_unsealed and replica_insecure_address, one
// per row.
func (m *Manager) unbelievedAlarms() []assembler.Alarm {
	var out []assembler.Alarm
	for _, u := range m.Unbelieved() {
		kind := AlarmReplicaUnsealed
		if u.Reason == UnbelievedInsecure {
			kind = AlarmReplicaInsecureAddress
		}
		out = append(out, assembler.Alarm{Kind: kind, Since: u.Since, Detail: fmt.Sprintf(
			"replica %q at %s (region %q, last seen %s by its row) is live by table replicas but not believed (%s): %s; it is not followed, dealt shards, sent evidence or counted",
			u.ID, u.Address, u.Region, u.LastSeen.Format(time.RFC3339), u.Reason, u.Detail)})
	}
	return out
}

// logTrust says at start what the manager believes.
func (m *Manager) logTrust(log *slog.Logger) {
	switch {
	case m.cfg.Sealer == nil:
		log.Info("no signing key: rows of table replicas are neither sealed nor checked")
	case m.cfg.BelieveUnsealed:
		log.Warn("upgrade mode: unsealed rows of table replicas (replicas of the release before) are believed; roll every replica again with MUSTER_PEER_TRUST=strict once none is left")
	}
	if m.cfg.Sealer != nil && m.cfg.AllowHTTP {
		log.Warn("MUSTER_PEER_ALLOW_HTTP: replicas at plain-http addresses off loopback are believed, followed and sent evidence in clear; for a lab only")
	}
}
