package ownership_test

import (
	"context"
	"crypto/ed25519"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/seal"
	"github.com/musterhq/muster/internal/testclock"
)

type sealKey struct {
	id   string
	priv ed25519.PrivateKey
}

func (k sealKey) KeyID() string             { return k.id }
func (k sealKey) Public() ed25519.PublicKey { return k.priv.Public().(ed25519.PublicKey) }
func (k sealKey) Sign(_ context.Context, msg []byte) ([]byte, error) {
	return ed25519.Sign(k.priv, msg), nil
}

func newSealKey(t *testing.T, id string) sealKey {
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return sealKey{id: id, priv: priv}
}

// sealedBy makes a replica seal its row with k and believe rows sealed
// by it, at address.
func sealedBy(k sealKey, address string) option {
	return func(c *ownership.Config) {
		c.Sealer, c.Trust, c.Address = k, seal.NewTrust(seal.Keys{}.With(k)), address
	}
}

// handRow writes a row into table replicas as an attacker with the
// database would: last_seen a day ahead, ready, the address of its choice.
func handRow(t *testing.T, pool *pgxpool.Pool, id, address string) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), `INSERT INTO replicas (id, started_at, last_seen, address, region, ready)
		VALUES ($1, clock_timestamp(), clock_timestamp() + interval '1 day', $2, 'test', true)`, id, address); err != nil {
		t.Fatal(err)
	}
}

func ids(rs []ownership.ReplicaStatus) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.ID)
	}
	return out
}

func unbelieved(r ownership.RegionStatus) map[string]string {
	out := map[string]string{}
	for _, u := range r.Unbelieved {
		out[u.ID] = u.Reason
	}
	return out
}

// nobodyDeals checks that no shard is held by or offered to id.
func nobodyDeals(t *testing.T, pool *pgxpool.Pool, id string) {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM shard_leases WHERE owner = $1 OR offered_to = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d shards held by or offered to %s", n, id)
	}
}

// TestOnlySealedRowsAreBelieved: a and b seal their rows with the
// region's key. A row written by hand (last_seen a day ahead), b's row
// with its address changed, a row sealed by another key and a sealed row
// at a plain-http address off loopback are none of them believed: they
// are not in the region's replicas, dealt or offered no shard, listed
// under unbelieved with the reason, counted, and each raises an alarm
// naming the row. b's next heartbeat restores its row.
func TestOnlySealedRowsAreBelieved(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	region, stranger := newSealKey(t, "region"), newSealKey(t, "stranger")
	a := newReplica(t, pool, "a", sealedBy(region, "https://a.muster:8080"))
	b := newReplica(t, pool, "b", sealedBy(region, "https://b.muster:8080"))
	// c is a genuine replica of the region in a lab (plain http on a
	// routable address), d one sealed by a key nobody here trusts.
	c := newReplica(t, pool, "c", sealedBy(region, "http://203.0.113.9:8080"), func(cfg *ownership.Config) { cfg.AllowHTTP = true })
	d := newReplica(t, pool, "d", sealedBy(stranger, "https://d.muster:8080"))
	rounds(t, a, b, c, d)
	handRow(t, pool, "rogue", "http://203.0.113.66:8080")
	if _, err := pool.Exec(t.Context(), `UPDATE replicas SET address = 'https://203.0.113.66:8443' WHERE id = 'b'`); err != nil {
		t.Fatal(err)
	}
	rounds(t, a, a)

	r := a.Region()
	if got := ids(r.Replicas); !slices.Equal(got, []string{"a"}) {
		t.Errorf("a believes %v, want only itself", got)
	}
	want := map[string]string{"rogue": ownership.UnbelievedUnsealed, "b": ownership.UnbelievedBadSeal,
		"c": ownership.UnbelievedInsecure, "d": ownership.UnbelievedUnknownKey}
	if got := unbelieved(r); !maps.Equal(got, want) {
		t.Errorf("unbelieved %v, want %v", got, want)
	}
	for _, id := range []string{"rogue", "b", "c", "d"} {
		nobodyDeals(t, pool, id)
	}
	if n := len(a.Owned()); n != shards {
		t.Errorf("a owns %d shards, want all %d: it is the only replica it believes", n, shards)
	}
	alarms := a.Alarms()
	for id, addr := range map[string]string{"rogue": "203.0.113.66:8080", "b": "203.0.113.66:8443", "d": "d.muster", "c": "203.0.113.9"} {
		kind := ownership.AlarmReplicaUnsealed
		if id == "c" {
			kind = ownership.AlarmReplicaInsecureAddress
		}
		if !slices.ContainsFunc(alarms, func(al assembler.Alarm) bool {
			return al.Kind == kind && strings.Contains(al.Detail, `"`+id+`"`) && strings.Contains(al.Detail, addr)
		}) {
			t.Errorf("no %s alarm naming %s at %s: %+v", kind, id, addr, alarms)
		}
	}
	for reason, n := range map[string]float64{"unsealed": 1, "bad_seal": 1, "unknown_key": 1, "insecure_address": 1} {
		if got := a.metric(t, "muster_replicas_unbelieved", reason); got != n {
			t.Errorf("muster_replicas_unbelieved{reason=%s} = %v, want %v", reason, got, n)
		}
	}

	// b heartbeats its own row again: believed, sealed, and dealt its
	// share; c is believed where plain http is allowed.
	rounds(t, b, a)
	r = a.Region()
	if got := ids(r.Replicas); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("after b's heartbeat a believes %v, want a and b", got)
	}
	for _, rep := range r.Replicas {
		if !rep.Sealed {
			t.Errorf("%s listed as unsealed", rep.ID)
		}
	}
	if _, ok := unbelieved(r)["b"]; ok {
		t.Errorf("b still unbelieved: %+v", r.Unbelieved)
	}
	rounds(t, b, a, b)
	if n := len(b.Owned()); n == 0 {
		t.Errorf("b, believed again, holds no shard")
	}
	if got := ids(c.Region().Replicas); !slices.Contains(got, "c") || slices.Contains(got, "rogue") {
		t.Errorf("c (plain http allowed) believes %v", got)
	}
}

// TestUpgradeModeBelievesUnsealedRows: with BelieveUnsealed (a rolling
// upgrade from a release that seals nothing) a row without a seal is
// believed and shown unsealed, but a seal that does not verify still is
// not.
func TestUpgradeModeBelievesUnsealedRows(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	region := newSealKey(t, "region")
	a := newReplica(t, pool, "a", sealedBy(region, "https://a.muster:8080"), func(c *ownership.Config) { c.BelieveUnsealed = true })
	b := newReplica(t, pool, "b", sealedBy(region, "https://b.muster:8080"))
	rounds(t, a, b)
	if _, err := pool.Exec(t.Context(), `INSERT INTO replicas (id, started_at, last_seen, address, region, ready)
		VALUES ('old', clock_timestamp(), clock_timestamp(), 'https://old.muster:8080', 'test', true)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), `UPDATE replicas SET address = 'https://203.0.113.66:8443' WHERE id = 'b'`); err != nil {
		t.Fatal(err)
	}
	rounds(t, a)
	r := a.Region()
	if got := ids(r.Replicas); !slices.Equal(got, []string{"a", "old"}) {
		t.Errorf("a in upgrade mode believes %v, want a and old", got)
	}
	for _, rep := range r.Replicas {
		if rep.Sealed != (rep.ID == "a") {
			t.Errorf("%s sealed %v", rep.ID, rep.Sealed)
		}
	}
	if got := unbelieved(r); !maps.Equal(got, map[string]string{"b": ownership.UnbelievedBadSeal}) {
		t.Errorf("unbelieved %v, want b's forged row only", got)
	}
}

// TestFreeShardsDealtAndNotTakenComeBack: a row no process stands behind
// (a dead replica's sealed row kept live by hand: last_seen a day ahead)
// is dealt half the free shards, which nobody takes. After OfferTimeout
// it is dealt nothing for a while, and the live replica takes them: no
// shard stays unowned for more than a few rounds.
func TestFreeShardsDealtAndNotTakenComeBack(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	clock := testclock.New(time.Now())
	handRow(t, pool, "ghost", "ghost:8080")
	a := newReplica(t, pool, "a", withClock(clock.Now))
	rounds(t, a)
	if n := len(a.Owned()); n != shards/2 {
		t.Fatalf("a holds %d shards beside a ready ghost, want %d", n, shards/2)
	}
	clock.Advance(3*testInterval + time.Millisecond)
	rounds(t, a)
	if n := len(a.Owned()); n != shards {
		t.Errorf("a holds %d shards once the ghost left its share untaken for the timeout, want all %d", n, shards)
	}
	nobodyDeals(t, pool, "ghost")
}
