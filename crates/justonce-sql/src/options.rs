//! The options structs' setters.

/// Chained setters for an options struct, one per field, named after it (`#[non_exhaustive]`
/// structs cannot be built with `..Default::default()` outside the crate). Fields under
/// `into` take `impl Into<String>`.
macro_rules! setters {
    ($ty:ident { $($field:ident: $t:ty),* $(,)? } $(into { $($sfield:ident),* $(,)? })?) => {
        impl $ty {
            $(
                #[doc = concat!("Sets [`", stringify!($ty), "::", stringify!($field), "`].")]
                #[must_use]
                pub fn $field(mut self, value: $t) -> Self {
                    self.$field = value;
                    self
                }
            )*
            $($(
                #[doc = concat!("Sets [`", stringify!($ty), "::", stringify!($sfield), "`].")]
                #[must_use]
                pub fn $sfield(mut self, value: impl Into<String>) -> Self {
                    self.$sfield = value.into();
                    self
                }
            )*)?
        }
    };
}
pub(crate) use setters;
