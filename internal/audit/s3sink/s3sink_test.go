package s3sink_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/audit/s3sink"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// puts records the headers of every PutObject gofakes3 received: it does
// not enforce Object Lock (it is a stand-in), so the lock is asserted on
// what the sink asked for.
type puts struct {
	mu  sync.Mutex
	got []http.Header
}

func (p *puts) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			p.mu.Lock()
			p.got = append(p.got, r.Header.Clone())
			p.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	})
}

func fakeS3(t *testing.T) (*s3.Client, *puts) {
	t.Helper()
	backend := s3mem.New()
	if err := backend.CreateBucket("audit"); err != nil {
		t.Fatal(err)
	}
	rec := &puts{}
	srv := httptest.NewServer(rec.wrap(gofakes3.New(backend).Server()))
	t.Cleanup(srv.Close)
	client := s3.New(s3.Options{
		Region: "eu-west-1", BaseEndpoint: aws.String(srv.URL), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
	})
	return client, rec
}

func TestCheckpointsGoToS3WithObjectLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client, rec := fakeS3(t)
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	sink, err := s3sink.New(s3sink.Config{Client: client, Bucket: "audit", Prefix: "muster/prod", Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	signer, err := audit.LoadOrCreateKeyFile(filepath.Join(t.TempDir(), "k"))
	if err != nil {
		t.Fatal(err)
	}
	pool := dbtest.New(t)
	cp, err := audit.NewCheckpointer(audit.CheckpointerConfig{Pool: pool, Signer: signer, Sink: sink, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		now = now.Add(time.Minute)
		if _, err := audit.AppendAlone(ctx, pool, now, audit.Entry{ActorKind: "system", Actor: "system", Action: "test", TargetKind: "service", Target: "web", Outcome: audit.Accepted, After: i}); err != nil {
			t.Fatal(err)
		}
		if c, err := cp.RunOnce(ctx, false); err != nil || c == nil || c.N != int64(i+1) {
			t.Fatalf("checkpoint %d: %+v %v", i+1, c, err)
		}
	}

	rec.mu.Lock()
	got := rec.got
	rec.mu.Unlock()
	if len(got) != 3 {
		t.Fatalf("%d PUTs, want 3", len(got))
	}
	for i, h := range got {
		put := now.Add(time.Duration(i-2) * time.Minute)
		want := put.Add(s3sink.DefaultRetention).Format(time.RFC3339)
		if m := h.Get("X-Amz-Object-Lock-Mode"); m != "COMPLIANCE" {
			t.Errorf("PUT %d: object lock mode %q, want COMPLIANCE", i, m)
		}
		if u := h.Get("X-Amz-Object-Lock-Retain-Until-Date"); u != want {
			t.Errorf("PUT %d: retain until %q, want %q (five years on)", i, u, want)
		}
		if h.Get("If-None-Match") != "*" {
			t.Errorf("PUT %d: If-None-Match %q, want *", i, h.Get("If-None-Match"))
		}
		if h.Get("X-Amz-Checksum-Sha256") == "" {
			t.Errorf("PUT %d carries no SHA-256 checksum (S3 wants one with Object Lock): %v", i, h)
		}
	}
	// An existing checkpoint is never overwritten.
	if err := sink.Put(ctx, audit.CheckpointName(1), []byte("{}")); err == nil {
		t.Fatal("overwrote checkpoint 1")
	}

	names, err := sink.List(ctx, audit.CheckpointName(1))
	if err != nil || len(names) != 2 || names[0] != audit.CheckpointName(2) {
		t.Fatalf("list after 1: %v %v", names, err)
	}
	cps, err := audit.LoadCheckpoints(ctx, sink, audit.Keys{signer.KeyID(): signer.Public()})
	if err != nil || len(cps) != 3 {
		t.Fatalf("load: %d %v", len(cps), err)
	}
	if rep, err := audit.VerifyCheckpoints(ctx, db.New(pool), cps); err != nil || rep.AnchoredSeq != 3 {
		t.Fatalf("verify: %+v %v", rep, err)
	}
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string][2]string{
		"s3://b/p/q": {"b", "p/q"}, "s3://b": {"b", ""}, "s3://b/": {"b", ""},
	} {
		b, p, err := s3sink.ParseURL(raw)
		if err != nil || b != want[0] || p != want[1] {
			t.Errorf("%s: %q %q %v", raw, b, p, err)
		}
	}
	for _, raw := range []string{"http://b/p", "s3:///p", "s3://b/p?x=1", "/dir"} {
		if _, _, err := s3sink.ParseURL(raw); err == nil {
			t.Errorf("%s: no error", raw)
		}
	}
}
