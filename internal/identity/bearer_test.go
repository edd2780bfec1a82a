package identity_test

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/musterhq/muster/internal/identity"
)

func TestBearerToken(t *testing.T) {
	t.Parallel()
	const tok = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"
	tests := []struct {
		name    string
		headers []string
		want    string
		wantErr error
	}{
		{"bearer", []string{"Bearer " + tok}, tok, nil},
		{"lowercase scheme", []string{"bearer " + tok}, tok, nil},
		{"mixed case scheme", []string{"BeArEr " + tok}, tok, nil},
		{"extra spaces", []string{"Bearer   " + tok + "  "}, tok, nil},
		{"token68 padding", []string{"Bearer abc+/~_-.=="}, "abc+/~_-.==", nil},
		{"no header", nil, "", identity.ErrNoToken},
		{"empty header", []string{""}, "", identity.ErrNoToken},
		{"scheme only", []string{"Bearer"}, "", identity.ErrNoToken},
		{"scheme and space", []string{"Bearer "}, "", identity.ErrNoToken},
		{"basic", []string{"Basic dXNlcjpwYXNz"}, "", identity.ErrNoToken},
		{"scheme prefix", []string{"Bearerx " + tok}, "", identity.ErrNoToken},
		{"no space", []string{"Bearer" + tok}, "", identity.ErrNoToken},
		{"two tokens", []string{"Bearer a b"}, "", identity.ErrInvalidToken},
		{"bad character", []string{"Bearer a,b"}, "", identity.ErrInvalidToken},
		{"padding in the middle", []string{"Bearer a=b"}, "", identity.ErrInvalidToken},
		{"only padding", []string{"Bearer =="}, "", identity.ErrInvalidToken},
		{"two headers", []string{"Bearer " + tok, "Bearer " + tok}, "", identity.ErrInvalidToken},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest("GET", "/v1/instances", nil)
			for _, h := range tt.headers {
				r.Header.Add("Authorization", h)
			}
			got, err := identity.BearerToken(r)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("token = %q, want %q", got, tt.want)
			}
			if err != nil && len(tt.headers) > 0 && len(tt.headers[0]) > 8 && strings.Contains(err.Error(), tt.headers[0]) {
				t.Errorf("error text contains the header")
			}
		})
	}
}

func FuzzBearerToken(f *testing.F) {
	for _, seed := range []string{
		"", "Bearer x", "bearer a.b.c", "Bearer  a", "Basic x", "Bearer a=b", "Bearer ==",
		"Bearer\ta", "BEARER a.b.c==", "Bearer a b", "Bearer \x00", "Bearer é",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, header string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header["Authorization"] = []string{header}
		tok, err := identity.BearerToken(r)
		if err != nil {
			if tok != "" {
				t.Fatalf("token %q returned with error %v", tok, err)
			}
			if !errors.Is(err, identity.ErrNoToken) && !errors.Is(err, identity.ErrInvalidToken) {
				t.Fatalf("unclassified error %v", err)
			}
			if len(header) > 8 && strings.Contains(err.Error(), header) {
				t.Fatalf("error text contains the header")
			}
			return
		}
		if tok == "" || !strings.Contains(header, tok) {
			t.Fatalf("token %q not taken from header %q", tok, header)
		}
		if !strings.EqualFold(strings.TrimSpace(header)[:7], "bearer ") {
			t.Fatalf("token %q accepted from header %q", tok, header)
		}
		if strings.ContainsAny(tok, " \t\r\n,;\"") {
			t.Fatalf("token %q contains a separator", tok)
		}
	})
}
