package relay

import (
	"bytes"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/stream"
)

// The appenders write what Decode reads back, the frames' bytes intact.
func TestRecordRoundTrip(t *testing.T) {
	at := time.Date(2026, 5, 4, 12, 0, 0, 123456789, time.UTC)
	view := &stream.Frame{Kind: stream.KindView, Service: "web", Version: 12, JSON: []byte(`{ "a" : "<&>\u00e9" }`), PublishedAt: at}
	delta := &stream.Frame{Kind: stream.KindDelta, Service: "web", Version: 12, FromVersion: 11, JSON: []byte(`{"d":[ 1 ]}`), Withdrawal: true}
	line, err := AppendUpdate(nil, stream.Update{View: view, Delta: delta, Rebased: true})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Count(line, []byte("\n")) != 1 || line[len(line)-1] != '\n' {
		t.Fatalf("not one line: %q", line)
	}
	r, err := Decode(line[:len(line)-1])
	if err != nil {
		t.Fatal(err)
	}
	u := r.Update()
	if r.Kind != KindUpdate || !r.PublishedAt.Equal(at) || u.View.Version != 12 || !bytes.Equal(u.View.JSON, view.JSON) ||
		u.Delta == nil || !bytes.Equal(u.Delta.JSON, delta.JSON) || u.Delta.FromVersion != 11 || !u.Delta.Withdrawal || !u.Rebased {
		t.Fatalf("round trip: %+v", r)
	}
	if _, err := AppendSnapshot(nil, &stream.Frame{Service: "web", Version: 1, JSON: []byte("{\n}")}); err == nil {
		t.Fatal("a frame of two lines was appended")
	}
}

func TestDecodeRefuses(t *testing.T) {
	const at = `,"published_at":"2026-01-01T00:00:00Z"`
	for _, line := range []string{
		``, `null`, `[]`, `{"kind":"drain"}`, `{"kind":"heartbeat","service":"web"}`,
		`{"kind":"snapshot","service":"Web!","version":1,"view":{}` + at + `}`,
		`{"kind":"snapshot","service":"web","version":0,"view":{}` + at + `}`,
		`{"kind":"snapshot","service":"web","version":1,"view":[]` + at + `}`,
		`{"kind":"snapshot","service":"web","version":1,"view":{}}`,
		`{"kind":"snapshot","service":"web","version":2,"view":{},"delta":{},"from_version":1` + at + `}`,
		`{"kind":"update","service":"web","version":2,"view":{},"delta":{},"from_version":2` + at + `}`,
		`{"kind":"update","service":"web","version":2,"view":{},"delta":"x","from_version":1` + at + `}`,
		`{"kind":"update","service":"web","version":2,"view":{},"from_version":1` + at + `}`,
		`{"kind":"update","service":"web","version":-2,"view":{}` + at + `}`,
		`{"kind":"update","service":"web","version":2,"view":{}` + at + `} trailing`,
	} {
		if r, err := Decode([]byte(line)); err == nil {
			t.Errorf("Decode(%s) = %+v, want an error", line, r)
		}
	}
	// A field this release does not know is ignored (a newer peer).
	if _, err := Decode([]byte(`{"kind":"heartbeat","added_later":1}`)); err != nil {
		t.Errorf("an unknown field: %v", err)
	}
}

// FuzzRelayRecord: Decode never panics, and whatever it accepts becomes
// an update the hub takes without breaking, that appends back to a line
// Decode reads as the same record.
func FuzzRelayRecord(f *testing.F) {
	for _, s := range []string{
		`{"kind":"heartbeat"}`,
		`{"kind":"snapshot","service":"web","version":3,"view":{"a":1},"published_at":"2026-01-01T00:00:00Z"}`,
		`{"kind":"update","service":"api","version":5,"view":{ "x" : "<&>" },"delta":{"d":1},"from_version":4,"withdrawal":true,"rebased":true,"published_at":"2026-01-01T00:00:00.5Z"}`,
		`{"kind":"update","service":"web","version":2,"view":"x"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := Decode(line)
		if err != nil || r.Kind == KindHeartbeat {
			return
		}
		u := r.Update()
		hub := stream.NewHub(stream.Config{})
		if n := hub.Relay([]stream.Update{u}); n != 1 {
			t.Fatalf("the hub took %d of one valid update", n)
		}
		if got, ok := hub.View(r.Service); !ok || got.Version != r.Version || !bytes.Equal(got.JSON, r.View) {
			t.Fatalf("the hub holds %+v", got)
		}
		u.View.PublishedAt = r.PublishedAt
		var out []byte
		if r.Kind == KindSnapshot {
			out, err = AppendSnapshot(nil, u.View)
		} else {
			out, err = AppendUpdate(nil, u)
		}
		if bytes.ContainsRune(r.View, '\n') || bytes.ContainsRune(r.Delta, '\n') {
			if err == nil {
				t.Fatal("a frame spanning lines was appended")
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		back, err := Decode(out[:len(out)-1])
		if err != nil {
			t.Fatalf("%s does not decode: %v", out, err)
		}
		if back.Kind != r.Kind || back.Service != r.Service || back.Version != r.Version || !bytes.Equal(back.View, r.View) ||
			!bytes.Equal(back.Delta, r.Delta) || back.FromVersion != r.FromVersion || back.Withdrawal != r.Withdrawal ||
			back.Rebased != r.Rebased || !back.PublishedAt.Equal(r.PublishedAt) {
			t.Fatalf("%s read back as %+v, was %+v", out, back, r)
		}
	})
}
