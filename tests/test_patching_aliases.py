"""The index of re-exports that patching shares across one enable (patching.Aliases)."""

from __future__ import annotations

import sys
import types

import pytest

from fibgen.runtime.routing import patching


def _api(x):
    return x


def _other(x):
    return -x


@pytest.fixture
def package(monkeypatch):
    """``pkg_aliases`` and ``pkg_aliases.a``, both binding ``_api``."""
    top, a = types.ModuleType("pkg_aliases"), types.ModuleType("pkg_aliases.a")
    top.api = a.api = a.again = _api
    top.other = _other
    monkeypatch.setitem(sys.modules, "pkg_aliases", top)
    monkeypatch.setitem(sys.modules, "pkg_aliases.a", a)
    return top, a


def test_every_binding_of_the_object_is_replaced_and_recorded(package):
    top, a = package
    done: list[patching.Patch] = []
    patching.Aliases().replace("pkg_aliases", _api, _other, done)
    assert (top.api, a.api, a.again) == (_other, _other, _other)
    assert sorted(p.attr for p in done) == ["again", "api", "api"]
    patching.restore(done)
    assert (top.api, a.api, a.again) == (_api, _api, _api)


def test_a_module_imported_after_the_first_look_is_read(package, monkeypatch):
    aliases = patching.Aliases()
    aliases.replace("pkg_aliases", object(), _api, [])  # the first look: nothing bound
    late = types.ModuleType("pkg_aliases.late")
    late.api = _api
    monkeypatch.setitem(sys.modules, "pkg_aliases.late", late)
    done: list[patching.Patch] = []
    aliases.replace("pkg_aliases", _api, _other, done)
    assert late.api is _other
    assert len(done) == 4  # top.api, a.api, a.again, late.api


def test_a_binding_changed_since_the_look_is_left_alone(package):
    top, a = package
    aliases = patching.Aliases()
    aliases.replace("pkg_aliases", object(), _api, [])  # the first look: nothing bound
    a.again = print  # rebound by someone else since
    aliases.replace("pkg_aliases", _api, _other, [])
    assert a.again is print and a.api is _other


def test_a_wrapper_patched_again_is_found_where_it_was_put(package):
    # A second API at a path that already holds the first's wrapper replaces every binding
    # of it, as a scan of the namespaces would.
    top, a = package
    aliases = patching.Aliases()

    def first(x):
        return x

    def second(x):
        return x

    aliases.replace("pkg_aliases", _api, first, [])
    aliases.replace("pkg_aliases", first, second, [])
    assert (top.api, a.api, a.again) == (second, second, second)


def test_each_package_is_read_when_first_asked_about(package, monkeypatch):
    other = types.ModuleType("pkg_aliases_other")
    other.api = _api
    monkeypatch.setitem(sys.modules, "pkg_aliases_other", other)
    aliases = patching.Aliases()
    aliases.replace("pkg_aliases", _api, _other, [])
    aliases.replace("pkg_aliases_other", _api, _other, [])
    assert other.api is _other


def test_a_stand_in_bound_since_the_look_is_found_at_every_name(package):
    # The index outlives an enable: an object put in the API's place at several names since
    # the namespaces were read is unknown to it, so the package is read again.
    top, a = package
    aliases = patching.Aliases()
    aliases.replace("pkg_aliases", object(), _api, [])  # the first look

    def stand_in(x):
        return x

    top.api = a.api = stand_in
    done: list[patching.Patch] = []
    aliases.replace("pkg_aliases", stand_in, _other, done, at=(top, "api"))
    assert top.api is _other and a.api is _other and a.again is _api
    assert sorted((p.attr, p.old is stand_in) for p in done) == [("api", True), ("api", True)]


def test_patching_twice_over_one_index_records_each_binding_once(package):
    top, a = package
    for _ in range(3):
        done: list[patching.Patch] = []
        assert patching.original("pkg_aliases.a.api") is _api
        assert patching.patch("pkg_aliases.a.api", _other, done) is _api
        assert (top.api, a.api, a.again) == (_other, _other, _other)
        assert sorted(p.attr for p in done) == ["again", "api", "api"]
        patching.restore(done)
        assert (top.api, a.api, a.again) == (_api, _api, _api)
