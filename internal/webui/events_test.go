package webui_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/wait"
)

// openEvents opens a live-update stream as b's session and, when it is
// accepted, reads its first line (the stream is then open on the
// server) and leaves it open until close is called. It returns the
// status and, for a refusal, the body.
func (b *browser) openEvents(t *testing.T) (status int, body string, close func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	req, err := http.NewRequestWithContext(ctx, "GET", b.base+"/ui/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	for k, v := range b.cookies {
		req.AddCookie(&http.Cookie{Name: k, Value: v})
	}
	b.mu.Unlock()
	res, err := b.client.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	close = func() { cancel(); res.Body.Close() }
	if res.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(res.Body)
		close()
		return res.StatusCode, string(raw), func() {}
	}
	line, err := bufio.NewReader(res.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "retry:") {
		close()
		t.Fatalf("the stream's first line %q, %v", line, err)
	}
	return res.StatusCode, "", close
}

// TestEventStreamsPerViewer: one signed-in viewer holds at most 8 of a
// replica's live-update streams, with every session of theirs counted
// together; the ninth is refused with 429 and a message saying why, and
// another viewer still gets a stream. Closing one gives the first viewer
// room again. Without the share, one viewer could hold all 500.
func TestEventStreamsPerViewer(t *testing.T) {
	t.Parallel()
	s := newUIStack(t)
	vera, vera2, oscar := newBrowser(t, s), newBrowser(t, s), newBrowser(t, s)
	vera.signIn("vera")
	vera2.signIn("vera") // a second session (another browser) of the same person
	oscar.signIn("oscar")

	var closes []func()
	defer func() {
		for _, c := range closes {
			c()
		}
	}()
	for i := range 8 {
		b := vera
		if i%2 == 1 {
			b = vera2
		}
		status, body, c := b.openEvents(t)
		if status != http.StatusOK {
			t.Fatalf("vera's stream %d: %d %s", i+1, status, body)
		}
		closes = append(closes, c)
	}
	for _, b := range []*browser{vera, vera2} {
		status, body, _ := b.openEvents(t)
		if status != http.StatusTooManyRequests || !strings.Contains(body, "8 live pages open") {
			t.Errorf("vera's ninth stream: %d %q; want 429 naming the share", status, body)
		}
	}
	status, body, c := oscar.openEvents(t)
	if status != http.StatusOK {
		t.Fatalf("oscar's stream while vera holds her share: %d %s", status, body)
	}
	closes = append(closes, c)

	// One of vera's closes: her next opens. The server counts it closed
	// when the handler returns, which follows the connection's end.
	closes[0]()
	closes[0] = func() {}
	wait.For(t, 10*time.Second, "vera's stream after closing one", func() bool {
		status, body, c := vera.openEvents(t)
		if status == http.StatusOK {
			closes = append(closes, c)
			return true
		}
		if status != http.StatusTooManyRequests {
			t.Fatalf("vera after closing a stream: %d %s", status, body)
		}
		return false
	})
}
