package relay_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/relay"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/tenure"
	"github.com/musterhq/muster/internal/wait"
)

// rogueEndpoints are eps with every address moved to 203.0.113.66.
func rogueEndpoints(eps []assembler.Endpoint) []assembler.Endpoint {
	out := append([]assembler.Endpoint(nil), eps...)
	for i := range out {
		out[i].Address = "203.0.113.66"
	}
	return out
}

// rawView is a view of service at v with eps, checksum sum (the
// endpoints' own when empty) and signature sig (none when nil).
func rawView(service string, v uint64, eps []assembler.Endpoint, sum string, sig *assembler.Signature) *stream.Frame {
	if sum == "" {
		sum = assembler.Checksum(eps)
	}
	b, _ := json.Marshal(assembler.View{Service: service, Version: v, Endpoints: eps, Zones: map[string]assembler.ZoneStatus{},
		GeneratedAt: time.Now().UTC(), Checksum: sum, Signature: sig})
	return &stream.Frame{Kind: stream.KindView, Service: service, Version: v, JSON: b, PublishedAt: time.Now()}
}

// line is the snapshot record of f, or the update record of f with
// delta d.
func line(t *testing.T, f, d *stream.Frame) []byte {
	t.Helper()
	g := *f // f may be shared by parallel tests
	g.PublishedAt = time.Now()
	f = &g
	var b []byte
	var err error
	if d == nil {
		b, err = relay.AppendSnapshot(nil, f)
	} else {
		b, err = relay.AppendUpdate(nil, stream.Update{View: f, Delta: d})
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// servePeer is a fake peer that answers every stream with lines, then a
// heartbeat, then holds the stream open.
func servePeer(t *testing.T, lines ...[]byte) (string, *atomic.Int64) {
	return fakePeer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		for _, l := range lines {
			_, _ = w.Write(l)
		}
		_, _ = w.Write(relay.Heartbeat)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
}

// A record whose view is not signed by the region's key over exactly its
// contents, or whose delta does not produce its view, is not applied: the
// hub keeps the genuine view it held, the stream ends, the refusal is
// counted and relay_forged names the peer (id and address).
func TestForgedRecordsAreRefused(t *testing.T) {
	t.Parallel()
	eps := endpoints(3)
	genuine := signedFrame(stream.KindView, "web", 0, 7, eps, "")
	_, otherKey, _ := ed25519.GenerateKey(rand.Reader)
	untrusted := assembler.SignWith("a", "0123456789abcdef", func(msg []byte) ([]byte, error) { return ed25519.Sign(otherKey, msg), nil }, nil)
	apiSum := assembler.Checksum(rogueEndpoints(eps))
	apiSig := viewSigner("api", 9, apiSum, assembler.ZonesDigest(nil))
	webSig := viewSigner("web", 9, assembler.Checksum(eps), assembler.ZonesDigest(nil))
	for _, tc := range []struct {
		name string
		rec  func(t *testing.T) []byte
	}{
		{"unsigned, valid public checksum", func(t *testing.T) []byte {
			return line(t, rawView("web", 9, rogueEndpoints(eps), "", nil), nil)
		}},
		{"another service's signed view renamed", func(t *testing.T) []byte {
			return line(t, rawView("web", 9, rogueEndpoints(eps), apiSum, apiSig), nil)
		}},
		{"signed view, endpoints changed and checksum recomputed", func(t *testing.T) []byte {
			return line(t, rawView("web", 9, rogueEndpoints(eps), "", webSig), nil)
		}},
		{"signed by a key nobody trusts", func(t *testing.T) []byte {
			sum := assembler.Checksum(rogueEndpoints(eps))
			return line(t, rawView("web", 9, rogueEndpoints(eps), "", untrusted("web", 9, sum, assembler.ZonesDigest(nil))), nil)
		}},
		{"record names web, view is api's", func(t *testing.T) []byte {
			f := rawView("api", 9, rogueEndpoints(eps), apiSum, apiSig)
			f.Service = "web"
			return line(t, f, nil)
		}},
		{"a delta that does not produce its view", func(t *testing.T) []byte {
			view := signedFrame(stream.KindView, "web", 0, 9, eps, "")
			up, _ := json.Marshal(rogueEndpoints(eps)[:1])
			d := &stream.Frame{Kind: stream.KindDelta, Service: "web", FromVersion: 7, Version: 9, JSON: fmt.Appendf(nil,
				`{"service":"web","from_version":7,"version":9,"upserts":%s,"checksum":%q,"signature":%s,"withdrawal":false,"generated_at":"2026-01-01T00:00:00Z"}`,
				up, assembler.Checksum(eps), mustJSON(webSig))}
			return line(t, view, d)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			addr, requests := servePeer(t, line(t, genuine, nil), tc.rec(t))
			ps := &peers{}
			ps.set(relay.Peer{ID: "a", Address: addr})
			r, b, reg := newRelay(t, ps, nil)
			wait.For(t, 10*time.Second, "two connections", func() bool { return requests.Load() >= 2 })
			if got := metric(t, reg, "muster_relay_forged_total", "a"); got < 1 {
				t.Fatalf("muster_relay_forged_total{peer=a} = %v", got)
			}
			if f, ok := b.View("web"); !ok || f.Version != 7 || string(f.JSON) != string(genuine.JSON) {
				t.Fatalf("b holds %+v, want the genuine web@7", f)
			}
			if al := alarmsOf(r.Alarms(), relay.AlarmRelayForged); len(al) != 1 || !strings.Contains(al[0].Detail, "replica a ("+addr+")") {
				t.Fatalf("relay_forged alarms %+v, want one naming replica a (%s)", al, addr)
			}
		})
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func alarmsOf(al []assembler.Alarm, kind string) []assembler.Alarm {
	var out []assembler.Alarm
	for _, a := range al {
		if a.Kind == kind {
			out = append(out, a)
		}
	}
	return out
}

// In a rolling upgrade (AcceptUnsigned) an unsigned view from a peer of
// the release before is taken, counted; its checksum is still checked.
// Without it the same view is refused.
func TestUnsignedViewsOnlyInAnUpgrade(t *testing.T) {
	t.Parallel()
	eps := endpoints(2)
	unsigned := line(t, rawView("web", 5, eps, "", nil), nil)
	badSum := line(t, rawView("api", 5, eps, strings.Repeat("0", 64), nil), nil)
	addr, requests := servePeer(t, unsigned, badSum)
	ps := &peers{}
	ps.set(relay.Peer{ID: "a", Address: addr})
	_, b, reg := newRelay(t, ps, func(c *relay.Config) { c.AcceptUnsigned = true })
	wait.For(t, 10*time.Second, "two connections", func() bool { return requests.Load() >= 2 })
	if f, ok := b.View("web"); !ok || f.Version != 5 {
		t.Fatalf("upgrade mode: b holds %+v, want the unsigned web@5", f)
	}
	if _, ok := b.View("api"); ok {
		t.Fatal("upgrade mode took a view whose checksum is not its endpoints'")
	}
	if got := metric(t, reg, "muster_relay_unsigned_total", "a"); got < 1 {
		t.Fatalf("muster_relay_unsigned_total{peer=a} = %v", got)
	}

	addr2, requests2 := servePeer(t, unsigned)
	ps2 := &peers{}
	ps2.set(relay.Peer{ID: "a", Address: addr2})
	_, b2, _ := newRelay(t, ps2, nil)
	wait.For(t, 10*time.Second, "two connections", func() bool { return requests2.Load() >= 2 })
	if _, ok := b2.View("web"); ok {
		t.Fatal("an unsigned view was taken outside an upgrade")
	}
}

// tenures is a fixed tenure book: epoch 1 is replica a's, epoch 2 nobody's,
// epoch 3 cannot be read.
type tenures struct{ lookups atomic.Int64 }

func (tn *tenures) Owner(_ context.Context, shard int, epoch uint64) (string, error) {
	tn.lookups.Add(1)
	switch epoch {
	case 1:
		return "a", nil
	case 4:
		return "c", nil
	case 2:
		return "", tenure.ErrNone
	default:
		return "", errors.New("database unreachable")
	}
}

// A signed view is refused when a sealed tenure of its shard names
// another replica, or when its shard has none under an epoch above every
// tenure seen; under an epoch the region issued, a missing tenure is
// alarmed and the view taken. Neither ends the stream; when the tenures
// cannot be read a view is taken on its signature and counted unchecked.
func TestViewsOnlyWithinTheirTenure(t *testing.T) {
	t.Parallel()
	eps := endpoints(2)
	at := func(service string, epoch, n uint64) []byte {
		return line(t, signedFrame(stream.KindView, service, 0, epoch<<assembler.CounterBits|n, eps, ""), nil)
	}
	addr, requests := servePeer(t, at("web", 1, 1), at("api", 2, 1), at("db", 3, 1), at("cache", 4, 1), at("web", 1, 2), at("api", 2, 2))
	ps := &peers{}
	ps.set(relay.Peer{ID: "a", Address: addr})
	book := &tenures{}
	r, b, reg := newRelay(t, ps, func(c *relay.Config) {
		c.Tenures = book
		c.ShardOf = func(string) (int, bool) { return 0, true }
	})
	wait.For(t, 10*time.Second, "web@2 of epoch 1", func() bool {
		f, ok := b.View("web")
		return ok && f.Version == 1<<assembler.CounterBits|2
	})
	// api@2 came first under an epoch above every tenure seen (a version
	// that would freeze it): refused. Once a tenure under epoch 4 was
	// seen, epoch 2 is one the region issued, and a missing tenure row is
	// an absence, never believed: api's second view is taken, alarmed.
	wait.For(t, 10*time.Second, "api's second view", func() bool {
		f, ok := b.View("api")
		return ok && f.Version == 2<<assembler.CounterBits|2
	})
	if _, ok := b.View("cache"); ok {
		t.Fatal("a view signed by a replica that is not the tenure's owner was taken")
	}
	if _, ok := b.View("db"); !ok {
		t.Fatal("a view whose tenure could not be read was refused")
	}
	if n := requests.Load(); n != 1 {
		t.Fatalf("%d connections: a view outside its tenure ended the stream", n)
	}
	if got := metric(t, reg, "muster_relay_outside_tenure_total", "a"); got != 3 {
		t.Fatalf("muster_relay_outside_tenure_total{peer=a} = %v, want 3", got)
	}
	if al := alarmsOf(r.Alarms(), relay.AlarmViewOutsideTenure); len(al) != 1 || !strings.Contains(al[0].Detail, "replica a ("+addr+")") {
		t.Fatalf("view_outside_tenure alarms %+v", al)
	}
	if al := alarmsOf(r.Alarms(), relay.AlarmRelayForged); len(al) != 0 {
		t.Fatalf("relay_forged raised for genuine views: %+v", al)
	}
}
