package reconcile_test

import (
	"testing"

	"github.com/musterhq/muster/db/dbtest"
)

// TestMain stops the package's PostgreSQL cluster after the tests.
func TestMain(m *testing.M) { dbtest.Main(m) }
