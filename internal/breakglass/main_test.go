package breakglass_test

import (
	"testing"

	"github.com/musterhq/muster/db/dbtest"
)

// TestMain stops the test PostgreSQL cluster the tests start (through
// apptest or dbtest) when they end; without it every run left one running.
func TestMain(m *testing.M) { dbtest.Main(m) }
