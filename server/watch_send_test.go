package server

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/musterhq/muster/internal/stream"
)

// TestRawSenderWritesFramesInOneGo: frames handed to the sender together
// arrive as consecutive SSE events, byte for byte, from one write; calls
// after it reuse the buffers and write what they are given, and each
// frame is counted by kind.
func TestRawSenderWritesFramesInOneGo(t *testing.T) {
	t.Parallel()
	s := &Server{cfg: Config{WatchWriteTimeout: time.Minute}}
	s.metrics.framesSent = newFramesSent()
	s.metrics.framesSentBy = nil // the fallback path counts too
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	send := s.rawSender(a)
	frames := []*stream.Frame{
		{Kind: stream.KindDelta, Version: 42, JSON: []byte(`{"a":1}`)},
		{Kind: stream.KindSynced, JSON: []byte(`{}`)},
		{Kind: stream.KindDelta, Version: 43, JSON: []byte(`{"b":2}`)},
	}
	want := "event: delta\nid: 42\ndata: {\"a\":1}\n\nevent: synced\ndata: {}\n\nevent: delta\nid: 43\ndata: {\"b\":2}\n\n"
	got := make(chan string, 1)
	go func() {
		buf := make([]byte, len(want))
		_, err := io.ReadFull(b, buf)
		if err != nil {
			got <- err.Error()
			return
		}
		got <- string(buf)
	}()
	if !send(frames...) {
		t.Fatal("send failed")
	}
	if g := <-got; g != want {
		t.Fatalf("wrote %q, want %q", g, want)
	}
	// Again, with fewer frames: nothing of the first call is left over.
	want2 := "event: heartbeat\ndata: {}\n\n"
	go func() {
		buf := make([]byte, len(want2))
		_, err := io.ReadFull(b, buf)
		if err != nil {
			got <- err.Error()
			return
		}
		got <- string(buf)
	}()
	if !send(&stream.Frame{Kind: stream.KindHeartbeat, JSON: []byte(`{}`)}) {
		t.Fatal("second send failed")
	}
	if g := <-got; g != want2 {
		t.Fatalf("second write %q, want %q", g, want2)
	}
	if n := testutil.ToFloat64(s.metrics.framesSent.WithLabelValues("delta")); n != 2 {
		t.Errorf("delta frames counted %v, want 2", n)
	}
	// A peer that is gone fails the send.
	b.Close()
	if send(frames[0]) {
		t.Error("send to a closed peer succeeded")
	}
}
