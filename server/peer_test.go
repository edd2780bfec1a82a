package server_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/peer"
	"github.com/musterhq/muster/internal/relay"
	"github.com/musterhq/muster/internal/seal"
	"github.com/musterhq/muster/internal/stream"
)

// peerRequest is a GET /v1/peer/updates signed by replica id with key
// (unsigned when key is nil).
func peerRequest(t *testing.T, ctx context.Context, s *apptest.Stack, id string, key seal.Signer) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+relay.Path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != nil {
		if err := (peer.Signer{ID: id, Key: key}).Sign(ctx, req, s.URL, nil); err != nil {
			t.Fatal(err)
		}
	}
	return req
}

// openPeer opens a signed peer stream and returns its line reader.
func openPeer(t *testing.T, s *apptest.Stack) *bufio.Reader {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	res, err := s.Client.Do(peerRequest(t, ctx, s, "peer-b", apptest.SealKey()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "application/x-ndjson" {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("peer stream: %d %v %s", res.StatusCode, res.Header, b)
	}
	return bufio.NewReaderSize(res.Body, 1<<20)
}

// nextRecord reads the next record that is not a heartbeat.
func nextRecord(t *testing.T, rd *bufio.Reader) relay.Record {
	t.Helper()
	for {
		line, err := rd.ReadBytes('\n')
		if err != nil {
			t.Fatalf("read a record: %v", err)
		}
		rec, err := relay.Decode(bytes.TrimSuffix(line, []byte("\n")))
		if err != nil {
			t.Fatalf("record %q: %v", line, err)
		}
		if rec.Kind != relay.KindHeartbeat {
			return rec
		}
	}
}

// TestPeerUpdatesNeedsAReplicaSignature (issue 27): the peer stream is
// served to a request signed with the region's key and to nothing else:
// not to an unsigned one, one signed with another key, a replayed one,
// nor to an operator's bearer token.
func TestPeerUpdatesNeedsAReplicaSignature(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	signed := peerRequest(t, ctx, s, "peer-b", apptest.SealKey())
	replay := peerRequest(t, ctx, s, "peer-b", nil)
	replay.Header = signed.Header.Clone()
	bearer := peerRequest(t, ctx, s, "", nil)
	bearer.Header.Set("Authorization", "Bearer "+s.Token(t, adminReq))

	// The genuine one first: the replay below is then of a signature
	// already seen.
	sctx, cancel := context.WithCancel(ctx)
	res, err := s.Client.Do(signed.WithContext(sctx))
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK {
		t.Fatalf("a signed request: %d", res.StatusCode)
	}
	cancel()
	res.Body.Close()

	for _, tc := range []struct {
		name string
		req  *http.Request
	}{
		{"unsigned", peerRequest(t, ctx, s, "", nil)},
		{"signed with another key", peerRequest(t, ctx, s, "peer-b", audit.NewKeySigner(priv))},
		{"replayed", replay},
		{"an operator's token", bearer},
	} {
		res, err := s.Client.Do(tc.req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		r := apptest.Response{Status: res.StatusCode, Header: res.Header, Body: b}
		if r.Status != http.StatusUnauthorized {
			t.Errorf("%s: %d %s", tc.name, r.Status, b)
			continue
		}
		if p := r.Problem(t); p.Type != "https://muster.dev/problems/unauthenticated" {
			t.Errorf("%s: problem %+v", tc.name, p)
		}
	}
}

// TestPeerUpdatesStream (issue 27): the stream opens with a snapshot of
// every view the hub holds, byte for byte, then carries each publication
// with its delta; a tap overflow brings a snapshot again; the hub's
// closing ends it.
func TestPeerUpdatesStream(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	// Bytes encoding/json would change (spaces, HTML characters) must
	// travel as they are.
	odd := func(kind stream.Kind, service string, from, v uint64) *stream.Frame {
		return &stream.Frame{Kind: kind, Service: service, FromVersion: from, Version: v,
			JSON: fmt.Appendf(nil, `{ "service": %q, "from_version":%d, "version": %d, "note": "<a&b>" }`, service, from, v)}
	}
	s.Hub.Publish([]stream.Update{{View: odd(stream.KindView, "web", 0, 10)}, {View: odd(stream.KindView, "api", 0, 11)}})
	rd := openPeer(t, s)
	for _, want := range []string{"api", "web"} {
		rec := nextRecord(t, rd)
		held, _ := s.Hub.View(want)
		if rec.Kind != relay.KindSnapshot || rec.Service != want || rec.Version != held.Version || !bytes.Equal(rec.View, held.JSON) || rec.Delta != nil {
			t.Fatalf("snapshot record %+v (view %s), want %s@%d %s", rec, rec.View, want, held.Version, held.JSON)
		}
	}

	view, delta := odd(stream.KindView, "web", 0, 12), odd(stream.KindDelta, "web", 10, 12)
	delta.Withdrawal = true
	s.Hub.Publish([]stream.Update{{View: view, Delta: delta}})
	rec := nextRecord(t, rd)
	if rec.Kind != relay.KindUpdate || rec.Version != 12 || rec.FromVersion != 10 || !rec.Withdrawal ||
		!bytes.Equal(rec.View, view.JSON) || !bytes.Equal(rec.Delta, delta.JSON) || rec.PublishedAt.IsZero() {
		t.Fatalf("update record %+v (view %s, delta %s)", rec, rec.View, rec.Delta)
	}

	// Relayed updates are not relayed again: only this replica's own.
	s.Hub.Relay([]stream.Update{{View: odd(stream.KindView, "other", 0, 13)}})

	// More publications at once than the tap holds (4,096): they are
	// lost, and a snapshot of every view follows.
	var burst []stream.Update
	for v := uint64(100); v < 100+4097; v++ {
		burst = append(burst, stream.Update{View: odd(stream.KindView, "api", 0, v)})
	}
	s.Hub.Publish(burst)
	var got []string
	for range 3 {
		rec := nextRecord(t, rd)
		got = append(got, fmt.Sprintf("%s %s@%d", rec.Kind, rec.Service, rec.Version))
	}
	if want := fmt.Sprint([]string{"snapshot api@4196", "snapshot other@13", "snapshot web@12"}); fmt.Sprint(got) != want {
		t.Fatalf("after an overflow: %v, want %s", got, want)
	}

	// Shutdown closes the hub: the stream ends, and WaitStreams returns.
	s.Hub.Close()
	for {
		if _, err := rd.ReadBytes('\n'); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("the stream ended with %v, want its end", err)
			}
			break
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := s.Server.WaitStreams(ctx); err != nil {
		t.Fatalf("wait for the streams: %v", err)
	}
}
