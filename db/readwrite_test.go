package db_test

import (
	"testing"

	"github.com/musterhq/muster/db"
)

func TestWithReadWrite(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://u:p@writer.example:5432/muster?sslmode=verify-full", "postgres://u:p@writer.example:5432/muster?sslmode=verify-full&target_session_attrs=read-write"},
		{"postgres://u@a:5432,b:5432/muster", "postgres://u@a:5432,b:5432/muster?target_session_attrs=read-write"},
		{"postgres://u@a/muster?target_session_attrs=any", "postgres://u@a/muster?target_session_attrs=any"},
		{"postgresql://u@a/muster?target_session_attrs=primary", "postgresql://u@a/muster?target_session_attrs=primary"},
	} {
		got, err := db.WithReadWrite(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("WithReadWrite(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := db.WithReadWrite("host=a user=u password=secret"); err == nil {
		t.Error("a key=value DSN was accepted")
	} else if want := "database url: want a postgres:// URL"; err.Error() != want {
		t.Errorf("error %q, want %q (it must not carry the password)", err, want)
	}
}
