// Package browsertest holds the browser tests of the tenant view against the real thing: a
// control plane with the aggregation layer, the live lease API server on a real store, the
// admission API, and headless Chromium driving the pages with each user's own credentials.
// See docs/tenant-view.md.
package browsertest
