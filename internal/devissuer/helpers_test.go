package devissuer_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/musterhq/muster/internal/devissuer"
)

const issuerPath = "/dev/issuer"

// devServer is an Issuer served at issuerPath on a loopback httptest
// server, its URL set. (identity's tests have one with knobs to break its
// endpoints; these tests need none.)
type devServer struct {
	issuer *devissuer.Issuer
	srv    *httptest.Server
}

func (s *devServer) URL() string { return s.srv.URL + issuerPath }

func newDevServer(t testing.TB) *devServer {
	t.Helper()
	return serveDevIssuer(t, t.TempDir())
}

func serveDevIssuer(t testing.TB, dir string) *devServer {
	t.Helper()
	d, err := devissuer.LoadOrCreate(dir)
	if err != nil {
		t.Fatalf("LoadOrCreate: %v", err)
	}
	s := &devServer{issuer: d, srv: httptest.NewServer(http.StripPrefix(issuerPath, d.Handler()))}
	t.Cleanup(s.srv.Close)
	if err := d.SetURL(s.URL()); err != nil {
		t.Fatalf("SetURL: %v", err)
	}
	return s
}
