package main

import (
	"os"
	"testing"

	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
)

// TestMain stops the development store the admission tests start.
func TestMain(m *testing.M) {
	code := m.Run()
	mongotest.Stop()
	os.Exit(code)
}
